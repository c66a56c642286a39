"""The run folder: where each file of a run lives, and how to open a finished run."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from mtl_cog.config import Config, config_from_dict
from mtl_cog.errors import UserError

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TEST_METRICS = "test_metrics.csv"
BEST_MODEL = "best_model.safetensors"
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
    return config_from_dict(yaml.safe_load(path.read_text()))


# Files added by the two-stage methods and the post-hoc calibrators (issue 3).
STAGE_ONE_MODEL = "stage_one_model.safetensors"  # TST / V-TST: the first-stage network, kept
STAGE_TWO_METRICS = "two_stage_metrics.jsonl"  # one line per second-stage epoch
STAGE_TWO_PARAMS = "parameters_stage_two.json"
POSTHOC_METRICS = "posthoc_metrics.csv"  # test metrics of each post-hoc calibrator, rows beside "none"


def posthoc_predictions_file(split: str, method: str) -> str:
    """Predictions of ``split`` after the post-hoc calibrator ``method``, e.g. predictions_test_ts.npz."""
    return f"predictions_{split}_{method}.npz"
