"""Finding run folders and reading what a comparison needs from them: data set, method, seed, variants.

A run folder (written by scripts/train_mtl.py) is recognised by its ``config.yaml`` next to
``test_metrics.csv`` or ``predictions_test.npz``. From it we read the data set (``data.task``),
the method (``method.name``) and the seed, and every *variant* of the run:

- the run itself (method ``<method>``): ``predictions_test.npz``, else ``test_metrics.csv``;
- post-hoc calibrators fitted on the run (method ``<method>+<posthoc>``): a prediction file
  ``predictions_test_<posthoc>.npz``, else the rows of ``posthoc_metrics.csv`` (long format, as
  ``scripts/evaluate.py --posthoc`` writes it: a column ``method`` (or ``posthoc``) naming the
  calibrator, ``none`` for the uncalibrated rows, a column ``task``, then metric columns named as
  in test_metrics.csv).

Runs are grouped by data set and by the protocol settings every method of a comparison must share
(``PROTOCOL_KEYS``); ``mtl_cog.reporting.tables`` scores and tabulates them.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.config import method_identity
from mtl_cog.config.loader import load_yaml
from mtl_cog.errors import ConfigError, ReportError
from mtl_cog.evaluation.metrics import (
    only_some_tasks,
)
from mtl_cog.evaluation.multitask_metrics import is_multitask_metric
from mtl_cog.evaluation.predictions import Predictions, load_predictions
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import covered_files, later_files, verify_digests
from mtl_cog.runs.finished import check_run_files
from mtl_cog.runs.task_spec import load_task_spec

POSTHOC_PREFIX = rundir.posthoc_predictions_file("test", "")[: -len(".npz")]  # "predictions_test_"


# Keys that do not change what a run computes; differences elsewhere between runs grouped together warn.
_IRRELEVANT_KEYS = {"seed", "run_name", "output_dir", "tracking", "wandb_project", "wandb_group",
                    "wandb_job_type", "data.root", "data.cache_dir",
                    "data.download", "data.use_cache", "train.eval_batch_size", "train.log_every_steps"}


# Besides every data option: settings every method of a comparison must share (the protocol).
# Runs that differ in one of them are ranked separately, never together. Learning rates and the
# method's own knobs are not here: they are tuned per method.
PROTOCOL_KEYS = ("train.epochs", "model.backbone", "model.cifar_stem", "model.pretrained", "model.timm_kwargs")


@dataclass
class Variant:
    """One row source of a run: the run itself or a post-hoc calibrator fitted on it."""

    method: str
    predictions: Path | None = None
    metrics: pd.DataFrame | None = None  # one row per task (+ optional "mean"), when no predictions


@dataclass
class RunRecord:
    run_dir: Path
    dataset: str
    method: str
    seed: int
    config: dict
    variants: list[Variant] = field(default_factory=list)


def _is_run_dir(path: Path) -> bool:
    return (path / rundir.CONFIG).is_file() and (
        (path / rundir.TEST_METRICS).is_file() or (path / rundir.predictions_file("test")).is_file()
    )


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder or a folder holding run folders (any depth).

    We do not descend into a run folder (its ``wandb/`` subfolder holds a ``config.yaml`` too).
    A folder with ``config.yaml`` but no test results or no ``DONE`` (an unfinished run) is skipped
    with a warning; one named directly is refused by ``load_run_record``.
    """
    found: list[Path] = []
    for start in map(Path, paths):
        if not start.is_dir():
            raise ReportError(f"{start} is not a folder (expected a run folder or a folder of runs).")
        stack = [start]
        while stack:
            folder = stack.pop()
            if _is_run_dir(folder) and (folder == start or (folder / rundir.DONE).is_file()):
                found.append(folder)
                continue
            if (folder / rundir.CONFIG).is_file() and folder.name != "files":  # wandb keeps files/config.yaml
                warnings.warn(f"skipping {folder}: it has {rundir.CONFIG} but no test results or no {rundir.DONE} "
                              "(unfinished run?)", stacklevel=2)
                continue
            stack.extend(sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True))
    unique = sorted(set(found))
    if not unique:
        raise ReportError(f"no run folders (config.yaml + {rundir.TEST_METRICS}) under: {', '.join(map(str, paths))}")
    return unique


def _read_config(run_dir: Path) -> dict:
    # Read the YAML as data rather than through mtl_cog.config: a report must still open runs
    # written by an older or newer version of the config schema.
    path = run_dir / rundir.CONFIG
    try:
        config = load_yaml(path.read_text(), str(path))  # refuses alias bombs (mtl_cog.config.loader)
    except (ConfigError, OSError, UnicodeDecodeError) as err:
        raise ReportError(str(err) if isinstance(err, ConfigError) else f"{path} cannot be read: {err}") from None
    for key in ("data.task", "method.name", "seed"):
        node = config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ReportError(f"{path}: missing key {key!r}; is this a run folder of scripts/train_mtl.py?")
            node = node[part]
    return config


def _read_metrics_csv(path: Path, expected_tasks: list[str] | None = None) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
        complete = path.read_bytes().endswith(b"\n")
    except Exception as err:  # noqa: BLE001  (pandas raises many parser error types)
        raise ReportError(f"{path} is not a readable CSV: {err}") from None
    if "task" not in frame.columns:
        raise ReportError(f"{path}: missing column 'task' (columns: {', '.join(frame.columns)}).")
    if not complete:  # every CSV we write ends with a newline: this one was cut short (a partial copy)
        raise ReportError(f"{path} does not end with a newline: it was cut short. Copy it again, or re-evaluate.")
    if expected_tasks is not None:
        _check_complete_run_metrics(path, frame, expected_tasks)
    return frame


def _check_complete_run_metrics(path: Path, frame: pd.DataFrame, expected_tasks: list[str]) -> None:
    """A run's test_metrics.csv: one row per task of its task_spec.json, whose mean is its ``mean`` row.

    Multi-task metrics (``is_multitask_metric``) are one value in the ``mean`` row; a metric only
    some tasks have (``classwise_ece@B``) is empty on the other rows and averaged over the rest.
    """
    tasks = [str(t) for t in frame["task"] if t != "mean"]
    numeric = frame.drop(columns=["task"]).select_dtypes("number")
    is_mean = (frame["task"] == "mean").to_numpy()
    per_task = numeric[[c for c in numeric.columns if not is_multitask_metric(c)]]
    task_rows, mean_row = per_task[~is_mean], per_task[is_mean]
    every_task = [c for c in per_task.columns if not only_some_tasks(c)]
    multitask = [c for c in numeric.columns if is_multitask_metric(c)]
    problem = None
    if sorted(tasks) != sorted(expected_tasks) or "mean" not in set(frame["task"]):
        problem = f"it has rows for {len(tasks)} of the run's {len(expected_tasks)} tasks (and the mean)"
    elif (per_task[every_task].isna().any(axis=None) or numeric.loc[is_mean, multitask].isna().any(axis=None)
          or (mean_row.iloc[0].isna() != task_rows.isna().all()).any()):  # a partial metric: a mean iff some task
        problem = "it has empty cells"
    elif not np.allclose(mean_row.iloc[0], task_rows.mean(), rtol=1e-6, atol=1e-9, equal_nan=True):
        problem = "its mean row is not the mean of its task rows"
    if problem:
        raise ReportError(f"{path} is incomplete or damaged: {problem}. Re-create it with scripts/evaluate.py "
                          f"--run {path.parent}, or copy the run again.")


def _posthoc_variants(run_dir: Path, method: str) -> list[Variant]:
    variants = {}
    verify_digests(run_dir, later_files(run_dir))  # written after the run finished, recorded by their writer
    for path in sorted(run_dir.glob(f"{POSTHOC_PREFIX}*.npz")):
        if path.name in covered_files():  # the run's own predictions (predictions_test_last.npz), no calibrator
            continue
        name = path.stem[len(POSTHOC_PREFIX):]
        variants[name] = Variant(f"{method}+{name}", predictions=path)
    csv = run_dir / rundir.POSTHOC_METRICS
    if csv.is_file():
        frame = _read_metrics_csv(csv)
        column = next((c for c in ("posthoc", "calibrator", "method") if c in frame.columns), None)
        if column is None:
            raise ReportError(f"{csv}: needs a column 'method' (or 'posthoc') naming the calibrator of each row.")
        for name, rows in frame.groupby(column, sort=True):
            # "none" repeats the uncalibrated run; a prediction file of the same calibrator wins
            if str(name) not in variants and str(name) != "none":
                variants[str(name)] = Variant(f"{method}+{name}", metrics=rows.drop(columns=[column]))
    return list(variants.values())


READ_FOR_TABLES = (rundir.CONFIG, rundir.TASK_SPEC, rundir.TEST_METRICS, rundir.predictions_file("test"))


def load_run_record(run_dir: str | Path) -> RunRecord:
    run_dir = Path(run_dir)
    # DONE, and the files below are the ones the run wrote (those it has: older runs lack some)
    check_run_files(run_dir, [name for name in READ_FOR_TABLES if (run_dir / name).is_file()])
    config = _read_config(run_dir)
    method = method_identity(config)  # the aggregator (mtl.aggregator) is part of the method compared
    record = RunRecord(run_dir, str(config["data"]["task"]), method, int(config["seed"]), config)
    test_predictions = run_dir / rundir.predictions_file("test")
    if test_predictions.is_file():
        record.variants.append(Variant(method, predictions=test_predictions))
    else:
        spec = run_dir / rundir.TASK_SPEC  # runs before task_spec.json existed are checked less
        tasks = list(load_task_spec(spec).task_names) if spec.is_file() else None
        record.variants.append(Variant(method, metrics=_read_metrics_csv(run_dir / rundir.TEST_METRICS, tasks)))
    record.variants.extend(_posthoc_variants(run_dir, method))
    return record


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and key != "timm_kwargs":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return out


def protocol_settings(config: dict) -> dict[str, str]:
    """The settings that must agree for runs to be ranked together: data options and ``PROTOCOL_KEYS``."""
    flat = _flatten(config)
    return {k: v for k, v in flat.items()
            if (k.startswith("data.") or k in PROTOCOL_KEYS) and k not in _IRRELEVANT_KEYS}


def label_datasets(records: list[RunRecord]) -> list[str]:
    """Split runs of one task that followed different protocols; -> one note per split, saying why.

    Runs of the same ``data.task`` whose data options, epochs, backbone or image size differ
    (``protocol_settings``) are not comparable: averaging or ranking them together would credit
    a method with its longer training or bigger images. Each distinct protocol is labelled
    ``<task>[key=value,...]`` with the keys that differ (at most three, else a short hash of the
    setting) and ranked on its own. The notes name the runs set apart from the largest group.
    """
    by_task: dict[str, list[RunRecord]] = {}
    for record in records:
        by_task.setdefault(record.dataset, []).append(record)
    notes = []
    for task, members in by_task.items():
        settings = [protocol_settings(r.config) for r in members]
        differing = sorted({k for s in settings for k in s if len({t.get(k) for t in settings}) > 1})
        if not differing:
            continue
        for record, mine in zip(members, settings):
            if len(differing) <= 3:
                tag = ",".join(f"{k.rsplit('.', 1)[-1]}={json.loads(mine.get(k, 'null'))}" for k in differing)
            else:
                tag = hashlib.sha1(json.dumps(mine, sort_keys=True).encode()).hexdigest()[:6]
            record.dataset = f"{task}[{tag}]"
        groups: dict[str, list[RunRecord]] = {}
        for record in members:
            groups.setdefault(record.dataset, []).append(record)
        main = max(groups, key=lambda label: (len(groups[label]), len({r.method for r in groups[label]}), label))
        for label, group in groups.items():
            if label == main:
                continue
            names = ", ".join(r.run_dir.name for r in group[:6]) + (" ..." if len(group) > 6 else "")
            notes.append(f"{task}: {len(group)} run(s) set apart from the {len(groups[main])} of {main} "
                         f"(they differ in {', '.join(differing)}); ranked separately as {label}: {names}")
    return notes


def warn_on_mixed_groups(records: list[RunRecord]) -> None:
    """Runs averaged together should differ only by seed; say which other keys differ."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.dataset, record.method), []).append(record)
    for (dataset, method), members in groups.items():
        flats = [{k: v for k, v in _flatten(r.config).items() if k not in _IRRELEVANT_KEYS} for r in members]
        differing = sorted({k for f in flats for k in f if len({g.get(k) for g in flats}) > 1})
        if differing:
            warnings.warn(f"{dataset}/{method}: runs averaged over seeds also differ in {', '.join(differing[:8])}",
                          stacklevel=2)
        seeds = [r.seed for r in members]
        if len(set(seeds)) < len(seeds):
            warnings.warn(f"{dataset}/{method}: several runs share a seed ({sorted(seeds)}); all are averaged.",
                          stacklevel=2)


def load_runs(paths: list[str | Path], notes: list[str] | None = None) -> list[RunRecord]:
    """Every run under ``paths``, labelled by protocol; ``notes`` (if given) receives what was set apart and why."""
    records = [load_run_record(path) for path in find_run_dirs(paths)]
    set_apart = label_datasets(records)
    if notes is not None:
        notes.extend(set_apart)
    warn_on_mixed_groups(records)
    return records


def pooled_predictions(records: list[RunRecord]) -> dict[tuple[str, str], list[Predictions]]:
    """(data set, method) -> the test predictions of every seed (variants without a prediction file skipped)."""
    pooled: dict[tuple[str, str], list[Predictions]] = {}
    for record in records:
        for variant in record.variants:
            if variant.predictions is not None:
                pooled.setdefault((record.dataset, variant.method), []).append(load_predictions(variant.predictions))
    return pooled
