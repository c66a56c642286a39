"""The run folder: the name of every file a run writes (defined here only), and its checks.

Write order and what each file means: ``docs/run_folder.md``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from mtl_cog.config import Config, load_config
from mtl_cog.errors import RunFolderError, UserError

CONFIG = "config.yaml"  # the resolved config (what ran)
METRICS = "metrics.jsonl"  # one line per epoch, then one final line
TEST_METRICS = "test_metrics.csv"  # per task + mean, best checkpoint on the test split
BEST_MODEL = "best_model.safetensors"  # the best checkpoint (for two-stage methods: of stage two)
STATE = "training_state.safetensors"  # everything needed to resume (mtl_cog.runs.training_state)
PARAMS = "parameters.json"  # parameter counts per part and the leader
TASK_SPEC = "task_spec.json"  # the data set's spec (tasks, classes, normalisation): predicting needs no data
RELIABILITY_PNG = "reliability_test.png"  # end-of-run reliability diagram (mtl_cog.reporting.run_report)
SMOOTH_RELIABILITY_PNG = "smooth_reliability_test.png"  # the smoothed (smooth-ECE) reliability diagram
COUNT_CALIBRATION_PNG = "count_calibration_test.png"  # expected vs actual positive attributes (>= 2 binary tasks)
DRIFT_JSONL = "calibration_drift.jsonl"  # scripts/calibration_drift.py: one line per reported epoch
DRIFT_PNG = "calibration_drift.png"  # its figure: ECE, sharpness and margins over epochs
TRUTH_METRICS = "test_truth_metrics.csv"  # noise-free metrics, where the data set knows p*
DONE = "DONE"  # written last: its presence marks a finished run
# Files added by the two-stage methods and the post-hoc calibrators.
STAGE_ONE_MODEL = "stage_one_model.safetensors"  # TST / V-TST: the first-stage network, kept
STAGE_TWO_METRICS = "two_stage_metrics.jsonl"  # one line per second-stage epoch
STAGE_TWO_PARAMS = "parameters_stage_two.json"
STAGE_TWO_STATE = "training_state_stage_two.safetensors"  # resumable state of the second stage
POSTHOC_METRICS = "posthoc_metrics.csv"  # test metrics of each post-hoc calibrator, rows beside "none"
POSTHOC_JSON = "posthoc_metrics.json"  # the same, as evaluate.py's JSON (written by reproduce)


def predictions_file(split: str) -> str:
    return f"predictions_{split}.npz"


def default_run_name(task: str, method: str, seed: int) -> str:
    return f"{task}-{method}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def load_run_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise RunFolderError(f"{run_dir} is not a run folder: {CONFIG} is missing.")
    return load_config(path)  # YAML and validation errors name the file and key



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
    if (run_dir / CONFIG).is_file():
        shutil.rmtree(run_dir)


def check_resumable(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise RunFolderError(f"--resume {run_dir}: no such folder.")
    if not (run_dir / CONFIG).is_file():
        raise RunFolderError(f"--resume {run_dir}: not a run folder ({CONFIG} is missing).")
    if (run_dir / DONE).exists():
        raise RunFolderError(f"--resume {run_dir}: this run already finished ({DONE} exists); nothing to resume.")
