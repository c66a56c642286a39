"""The run folder: where each file of a run lives, and how to open a finished run."""

from __future__ import annotations

import time
from pathlib import Path

from mtl_cog.config import Config, load_config
from mtl_cog.errors import UserError

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TEST_METRICS = "test_metrics.csv"
BEST_MODEL = "best_model.safetensors"
STATE = "training_state.safetensors"  # everything needed to resume (mtl_cog/resume.py)
PARAMS = "parameters.json"
DONE = "DONE"  # written last: its presence marks a finished run


def predictions_file(split: str) -> str:
    return f"predictions_{split}.npz"


def default_run_name(task: str, method: str, seed: int) -> str:
    return f"{task}-{method}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunFolderError(UserError, ValueError):
    """A folder that is not (or not yet) a run folder."""


def load_run_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise RunFolderError(f"{run_dir} is not a run folder: {CONFIG} is missing.")
    return load_config(path)  # YAML and validation errors name the file and key


# Files added by the two-stage methods and the post-hoc calibrators (issue 3).
STAGE_ONE_MODEL = "stage_one_model.safetensors"  # TST / V-TST: the first-stage network, kept
STAGE_TWO_METRICS = "two_stage_metrics.jsonl"  # one line per second-stage epoch
STAGE_TWO_PARAMS = "parameters_stage_two.json"
POSTHOC_METRICS = "posthoc_metrics.csv"  # test metrics of each post-hoc calibrator, rows beside "none"


def posthoc_predictions_file(split: str, method: str) -> str:
    """Predictions of ``split`` after the post-hoc calibrator ``method``, e.g. predictions_test_ts.npz."""
    return f"predictions_{split}_{method}.npz"


def check_new_run(run_dir: Path, overwrite: bool) -> None:
    """Refuse to start a run in a folder holding another run (finished or not), unless ``overwrite``.

    Read-only, so every process can call it and all stop together.
    """
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    if not (run_dir / CONFIG).is_file():
        raise RunFolderError(
            f"{run_dir} exists, is not empty and is not a run folder; choose another run_name or output_dir."
        )
    if overwrite:
        return
    if (run_dir / DONE).exists():
        raise RunFolderError(
            f"{run_dir} already holds a finished run. Choose another run_name, or pass --overwrite to replace it."
        )
    raise RunFolderError(
        f"{run_dir} holds an unfinished run. Continue it with --resume {run_dir}, or pass --overwrite to start over."
    )


def clear_run(run_dir: Path) -> None:
    """Delete a run folder (only one that ``check_new_run`` recognised as a run) before overwriting it."""
    import shutil

    if (run_dir / CONFIG).is_file():
        shutil.rmtree(run_dir)


def check_resumable(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise RunFolderError(f"--resume {run_dir}: no such folder.")
    if not (run_dir / CONFIG).is_file():
        raise RunFolderError(f"--resume {run_dir}: not a run folder ({CONFIG} is missing).")
    if (run_dir / DONE).exists():
        raise RunFolderError(f"--resume {run_dir}: this run already finished ({DONE} exists); nothing to resume.")
