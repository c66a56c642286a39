"""The run folder: the name of every file a run writes (defined here only), and its checks.

Write order and what each file means: ``docs/reference/run_folder.md``; how each failure is handled:
``docs/guides/failure_paths.md``.

A folder is a run folder when it holds ``mtl_cog_run.json`` (``RUN_MARKER``), written when the
run creates the folder; folders of runs made before the marker existed are recognised by their
training state's format. Only a run folder is resumed or replaced (``--overwrite``), and
``--overwrite`` deletes only the files a run writes: any other file in the folder makes it refuse,
so nothing a user put there is lost. While a run is in progress its folder is locked
(``LOCK``, see ``mtl_cog.locks``).
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

from mtl_cog import locks
from mtl_cog.config import Config, load_config
from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.io import atomic_write_json, check_writable, is_temp_file_name, make_folder, remove_temp_files
from mtl_cog.runs.checkpoint import read_metadata

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
DIGESTS = "digests.json"  # just before DONE: size and xxh3 of the files readers use (mtl_cog.runs.digests)
TIMING = "timing.jsonl"  # one line per epoch: seconds, torch threads, training images, processes (not results)
RESUMES = "resumes.jsonl"  # one line per --resume that changed settings: when, which keys, old -> new
# Files added by the two-stage methods and the post-hoc calibrators.
STAGE_ONE_MODEL = "stage_one_model.safetensors"  # TST / V-TST: the first-stage network, kept
STAGE_TWO_METRICS = "two_stage_metrics.jsonl"  # one line per second-stage epoch
STAGE_TWO_PARAMS = "parameters_stage_two.json"
STAGE_TWO_STATE = "training_state_stage_two.safetensors"  # resumable state of the second stage
POSTHOC_METRICS = "posthoc_metrics.csv"  # test metrics of each post-hoc calibrator, rows beside "none"
POSTHOC_JSON = "posthoc_metrics.json"  # the same, as evaluate.py's JSON (written by reproduce)
GROUP_METRICS = "group_metrics.csv"  # eval.groups: every task's metrics inside each group (mtl_cog.evaluation.groups)
SHIFT_METRICS = "shift_metrics.csv"  # eval.shift / evaluate --shift: metrics per corruption x severity x method
SHIFT_PNG = "shift_test.png"  # accuracy, NLL and ECE@15 against severity
RISK_COVERAGE_PNG = "risk_coverage_test.png"  # selective prediction: risk against coverage per task and mean
# Bookkeeping.
RUN_MARKER = "mtl_cog_run.json"  # written first: this folder is an mtl_cog run (format, when, where)
LOCK = "run.lock"  # present while a process writes into the run (mtl_cog.locks)
WANDB_ID = "wandb_run_id"  # the W&B run id, reused on --resume (mtl_cog.runs.tracking)
WANDB_DIR = "wandb"  # W&B's own files (offline runs to sync later)
MARKER_FORMAT = "mtl_cog.run_folder.v1"
STATE_FORMAT = "mtl_cog.training_state.v1"  # the training state's format tag (mtl_cog.runs.training_state)


def predictions_file(split: str) -> str:
    return f"predictions_{split}.npz"


def last_epoch_split(split: str) -> str:
    """``val`` -> ``val_last``: the last epoch's network on ``split`` (``eval.score_last_epoch``), beside the
    selected checkpoint's ``predictions_val.npz``: ``predictions_val_last.npz``."""
    return f"{split}_last"


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


def written_by_a_run(name: str) -> bool:
    """Whether a file or folder called ``name`` inside a run folder is one that runs write."""
    fixed = {CONFIG, METRICS, TEST_METRICS, BEST_MODEL, STATE, PARAMS, TASK_SPEC, RELIABILITY_PNG, TRUTH_METRICS,
             DONE, STAGE_ONE_MODEL, STAGE_TWO_METRICS, STAGE_TWO_PARAMS, STAGE_TWO_STATE, POSTHOC_METRICS,
             POSTHOC_JSON, RESUMES, TIMING, RUN_MARKER, LOCK, WANDB_ID, WANDB_DIR, SMOOTH_RELIABILITY_PNG,
             COUNT_CALIBRATION_PNG, DRIFT_JSONL, DRIFT_PNG, DIGESTS, GROUP_METRICS, SHIFT_METRICS, SHIFT_PNG,
             RISK_COVERAGE_PNG}
    return (name in fixed or (name.startswith("predictions_") and name.endswith(".npz"))
            or is_temp_file_name(name))  # left by a killed atomic write


def write_marker(run_dir: Path) -> None:
    atomic_write_json(run_dir / RUN_MARKER, {"format": MARKER_FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                             "host": socket.gethostname(), "folder": run_dir.name})


def is_run_folder(run_dir: Path) -> bool:
    """Whether ``run_dir`` verifiably holds an mtl_cog run (see the module docstring); reads headers only."""
    try:
        if json.loads((run_dir / RUN_MARKER).read_text()).get("format") == MARKER_FORMAT:
            return True
    except (OSError, ValueError, AttributeError):
        pass
    # runs made before the marker existed: a config and a training state in our format
    state = run_dir / STATE
    if not ((run_dir / CONFIG).is_file() and state.is_file()):
        return False
    try:
        return read_metadata(state).get("format") == STATE_FORMAT
    except UserError:
        return False


def _refuse_if_locked(run_dir: Path) -> None:
    holder = locks.live_holder(run_dir / LOCK)
    if holder is not None:
        raise RunFolderError(f"{run_dir} is in use by a run in progress: {holder.describe()}. Wait for it to finish, "
                             f"or choose another run_name. If that run is no longer running, delete {run_dir / LOCK}.")


def check_new_run(run_dir: Path, overwrite: bool) -> None:
    """Refuse to start a run in a folder holding another run (finished or not), unless ``overwrite``.

    Read-only, so every process can call it and all stop together. With ``overwrite`` the folder
    must be a run folder (``is_run_folder``) holding nothing but files a run writes, and no run
    may be in progress in it.
    """
    if run_dir.is_dir():
        _refuse_if_locked(run_dir)
    _check_new_run_folder(run_dir, overwrite)


def _check_new_run_folder(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} exists and is a file, not a folder; choose another run_name or output_dir.")
    if not run_dir.exists() or not [e for e in run_dir.iterdir() if e.name != LOCK]:
        return
    if not is_run_folder(run_dir):
        raise RunFolderError(
            f"{run_dir} exists, is not empty and is not an mtl_cog run folder (no valid {RUN_MARKER}); "
            "choose another run_name or output_dir (--overwrite only replaces run folders)."
        )
    if overwrite:
        others = sorted(e.name for e in run_dir.iterdir() if not written_by_a_run(e.name))
        if others:
            raise RunFolderError(
                f"--overwrite: {run_dir} also holds files that no run writes ({', '.join(others[:10])}"
                f"{' ...' if len(others) > 10 else ''}); nothing was deleted. Move them elsewhere first, "
                "or choose another run_name."
            )
        return
    if (run_dir / DONE).exists():
        raise RunFolderError(
            f"{run_dir} already holds a finished run. Choose another run_name, or pass --overwrite to replace it."
        )
    raise RunFolderError(
        f"{run_dir} holds an unfinished run. Continue it with --resume {run_dir}, or pass --overwrite to start over."
    )


def clear_run(run_dir: Path) -> None:
    """Delete what a run wrote in ``run_dir`` before it is overwritten (``check_new_run`` verified it
    holds nothing else); the lock, held by the caller, stays."""
    for entry in run_dir.iterdir():
        if entry.name == LOCK or not written_by_a_run(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def create_run_folder(run_dir: Path, overwrite: bool) -> locks.RunLock:
    """Create the folder of a new run (emptying an old run's with ``overwrite``), lock it, mark it.

    Main process only, once the run is known to start (data and network built): a run that fails
    earlier leaves no folder, and an ``--overwrite`` run that fails earlier leaves the old run intact.
    The checks of ``check_new_run`` are repeated under the lock: another run may have taken the
    name since.
    """
    make_folder(run_dir)
    held = locks.acquire(run_dir / LOCK, str(run_dir))
    try:
        _check_new_run_folder(run_dir, overwrite)
        if overwrite:
            clear_run(run_dir)
        remove_temp_files(run_dir)
        write_marker(run_dir)
    except BaseException:
        held.release()
        raise
    return held


def check_resumable(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise RunFolderError(f"--resume {run_dir}: no such folder.")
    if not (run_dir / CONFIG).is_file():
        raise RunFolderError(f"--resume {run_dir}: not a run folder ({CONFIG} is missing).")
    if not is_run_folder(run_dir):
        raise RunFolderError(f"--resume {run_dir}: not verifiably an mtl_cog run (no valid {RUN_MARKER} and no "
                             f"training state); refusing to write into it.")
    if (run_dir / DONE).exists():
        raise RunFolderError(f"--resume {run_dir}: this run already finished ({DONE} exists); nothing to resume.")


def open_for_resume(run_dir: Path) -> locks.RunLock:
    """Lock the folder of a run to be resumed and remove what killed writes left; main process only."""
    check_resumable(run_dir)
    held = locks.acquire(run_dir / LOCK, f"--resume {run_dir}")
    try:
        remove_temp_files(run_dir)
        if not (run_dir / RUN_MARKER).exists():  # a run from before the marker: mark it now
            write_marker(run_dir)
    except BaseException:
        held.release()
        raise
    return held


def check_output_dir(output_dir: Path) -> None:
    """Refuse an ``output_dir`` that cannot hold run folders (a file, or read-only) before any work starts."""
    check_writable(output_dir, "output_dir", folder=True)
