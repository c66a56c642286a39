"""The one check every reader of a run folder goes through: finished, its files the ones it wrote, its spec valid.

A number computed from a run folder is only the run's number if the folder holds a finished run
(``DONE``: its best checkpoint and predictions no longer change), the files read are the ones the
run wrote (``digests.json``, ``mtl_cog.runs.digests``) and its config and task spec are valid.
Every reader calls ``check_finished_run`` with the files it is about to read (``load_run``,
``evaluate`` in every mode, ``compare``, ``list-front``, post-hoc fitting, and the campaign
commands when they collect their runs' results), so a run killed mid-way, a file swapped for
another run's, or an edited spec ends in one ``error:`` line naming the run and the file instead
of numbers that look right. ``finished_predictions`` is that check plus reading prediction files,
the way campaigns collect validation and test predictions.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mtl_cog.config import Config
from mtl_cog.errors import RunFolderError
from mtl_cog.evaluation.predictions import Predictions, load_predictions
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import verify_digests
from mtl_cog.runs.task_spec import load_task_spec


def check_finished_run(run_dir: str | Path, files: Iterable[str] = (), allow_unfinished: bool = False,
                       unfinished_option: str = "") -> Config:
    """The config of the finished run in ``run_dir``, once ``files`` (names inside it) are checked; else a
    ``RunFolderError`` naming the run and the file (``check_run_files`` says what is checked)."""
    cfg = rundir.load_run_config(run_dir)  # first: a folder that is no run, or a broken config, says so
    check_run_files(run_dir, files, allow_unfinished, unfinished_option)
    return cfg


def check_run_files(run_dir: str | Path, files: Iterable[str] = (), allow_unfinished: bool = False,
                    unfinished_option: str = "") -> None:
    """``check_finished_run`` without validating the config against today's schema (``compare`` reads runs of
    older and newer schemas as plain YAML).

    Checked: ``run_dir`` holds a ``config.yaml``; ``DONE`` exists (a run without it is refused: its
    checkpoint may still change, and a run killed mid-way has no result; ``allow_unfinished``, an
    explicit option of the caller named by ``unfinished_option``, opens it anyway); each of
    ``files`` exists; they, the config and the task spec match ``digests.json``; the task spec
    (where the run has one: runs from before it have none) is valid.
    """
    run_dir = Path(run_dir)
    if not (run_dir / rundir.CONFIG).is_file():
        raise RunFolderError(f"{run_dir} is not a run folder: {rundir.CONFIG} is missing.")
    if not (run_dir / rundir.DONE).is_file() and not allow_unfinished:
        hint = f", or pass {unfinished_option} to use its last best checkpoint anyway" if unfinished_option else ""
        raise RunFolderError(f"{run_dir} has not finished ({rundir.DONE} is missing): it was stopped or is still "
                             f"running, so its files are not its result. Finish it with --resume {run_dir}{hint}.")
    names = tuple(dict.fromkeys(files))
    for name in names:
        if not (run_dir / name).is_file():
            raise RunFolderError(f"{run_dir / name} is missing: the run did not write it, or it was removed. "
                                 "Restore the run folder from a copy, or retrain.")
    verify_digests(run_dir, tuple(dict.fromkeys((rundir.CONFIG, rundir.TASK_SPEC, *names))))
    if (run_dir / rundir.TASK_SPEC).is_file():
        load_task_spec(run_dir / rundir.TASK_SPEC)  # types, ranges, unique names


def finished_predictions(run_dir: str | Path, splits: Iterable[str] = ("val", "test")) -> dict[str, Predictions]:
    """{split: the run's ``predictions_<split>.npz``}, read only after ``check_finished_run`` passed on them.

    Their task names must be the run's (``task_spec.json``), which catches a file of another data set
    even in a run from before digests were recorded.
    """
    run_dir = Path(run_dir)
    splits = tuple(splits)
    check_finished_run(run_dir, [rundir.predictions_file(s) for s in splits])
    spec_path = run_dir / rundir.TASK_SPEC
    tasks = list(load_task_spec(spec_path).task_names) if spec_path.is_file() else None
    out = {}
    for split in splits:
        path = run_dir / rundir.predictions_file(split)
        out[split] = load_predictions(path)
        if tasks is not None and list(out[split].task_names) != tasks:
            raise RunFolderError(f"{path} holds predictions for tasks {list(out[split].task_names)[:3]}..., not the "
                                 f"run's {tasks[:3]}... ({rundir.TASK_SPEC}): it belongs to another run. Restore the "
                                 "run folder from a copy, or retrain.")
    return out
