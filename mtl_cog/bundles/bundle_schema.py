"""One schema for every file of a results bundle: each column's type and range, each file's unique key.

Every published number is recomputed from a bundle (``mtl_cog.bundles.bundle``), so a cell that
is not what its column means must be refused, not read: an ``epoch`` of ``x`` silently dropped a
curve's rows, a ratio of ``abc`` a ratio of a paired table, a role ``banana`` became a role, a
23-digit seed or a ``wall_s`` of ``nan`` ended in tracebacks, and two contradicting rows for one
(run, split, task, metric) were both kept. ``validate`` checks a file read as text (every cell a
string, "" when empty) against its ``TableSchema`` and raises one ``UserError`` line naming the
file, the column, the first bad row and what is allowed.

``SCHEMAS`` maps a bundle file's name to its schema: a new bundle file is one entry here (its
columns, its key), and the manifest (``bundle_manifest``) seals whatever files the bundle holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mtl_cog.errors import UserError

ROLES = ("trial", "final", "curve", "sweep")
STATUSES = ("done", "failed", "pruned")
TRIAL_STATES = ("complete", "pruned", "fail", "running", "waiting")  # optuna's, lower case
MAX_SEED = 2**32 - 1  # numpy's and Python's seeding take [0, 2**32 - 1] (config.schema.MAX_SEED)
# results.csv.gz splits: the selected checkpoint's val/test, the last epoch's (``@last``), the test split after a
# post-hoc calibrator (``+<name>``), and the learned calibrator's final values
SPLIT = re.compile(r"(?:val|test|calibrator|val@last|test@last)|(?:test|test@last)\+[A-Za-z0-9_.-]+")
NAME = re.compile(r"[^\x00-\x1f\x7f]+")  # a non-empty label without control characters


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # name, text, int, float, bool, choice, pattern, ints (space-separated whole numbers)
    optional: bool = False  # "" allowed
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    pattern: re.Pattern | None = None
    nan: bool = False  # a float column that may hold nan (a curve's value before it is defined)


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # one row per key
    extra: bool = False  # further columns allowed (trials.csv: one per tuned parameter), read as text


def _c(name: str, kind: str, **kw) -> Column:
    return Column(name, kind, **kw)


RUNS_SCHEMA = TableSchema((
    _c("run", "name"), _c("campaign", "name"), _c("data", "name"), _c("method", "name"),
    _c("role", "choice", choices=ROLES), _c("draw", "text"), _c("trial", "text"),
    _c("ratio", "float", optional=True, low=0.0), _c("seed", "int", low=0, high=MAX_SEED),
    _c("config_digest", "name"), _c("status", "choice", choices=STATUSES), _c("reason", "text"),
    _c("train_size", "int", optional=True, low=0), _c("val_size", "int", optional=True, low=0),
    _c("test_size", "int", optional=True, low=0), _c("epochs_run", "int", optional=True, low=0),
    _c("converged", "bool", optional=True), _c("wall_s", "float", optional=True, low=0.0),
    _c("threads", "ints", optional=True, low=1), _c("versions", "text"), _c("commit", "text")), key=("run",))
RESULTS_SCHEMA = TableSchema((
    _c("run", "name"), _c("split", "pattern", pattern=SPLIT), _c("task", "name"), _c("metric", "name"),
    _c("value", "float")), key=("run", "split", "task", "metric"))
CURVES_SCHEMA = TableSchema((
    _c("run", "name"), _c("epoch", "int", low=0, high=10**6), _c("split", "name"), _c("metric", "name"),
    _c("value", "float", nan=True)), key=("run", "split", "metric", "epoch"))
TRIALS_SCHEMA = TableSchema((
    _c("study", "name"), _c("trial", "int", low=0, high=10**6), _c("state", "choice", choices=TRIAL_STATES),
    _c("counted", "bool", optional=True), _c("draw", "int", optional=True, low=0),
    _c("retry_of", "int", optional=True, low=0), _c("epochs_trained", "int", optional=True, low=0),
    _c("val_nll", "float", optional=True), _c("chosen", "choice", optional=True, choices=("*",))),
    key=("study", "trial"), extra=True)
# per run, split and task, 20 bins (bundle_reliability): whole counts, the sums' numbers checked there
RELIABILITY_SCHEMA = TableSchema((
    _c("run", "name"), _c("split", "pattern", pattern=SPLIT), _c("task", "name"), _c("count", "ints", low=0),
    _c("confidence_sum", "text"), _c("outcome_sum", "ints", low=0), _c("truth_sum", "text")),
    key=("run", "split", "task"))
SCHEMAS = {"runs.csv": RUNS_SCHEMA, "results.csv.gz": RESULTS_SCHEMA, "curves.csv.gz": CURVES_SCHEMA,
           "trials.csv": TRIALS_SCHEMA, "reliability.csv.gz": RELIABILITY_SCHEMA}


def _bad_cells(cells: pd.Series, column: Column) -> pd.Series:
    """Whether each (text) cell breaks ``column``'s rule."""
    empty = cells == ""
    if column.kind == "text":
        return pd.Series(False, index=cells.index)
    if column.kind == "name":
        bad = ~cells.str.fullmatch(NAME)
    elif column.kind in ("choice", "bool"):
        bad = ~cells.isin(column.choices if column.kind == "choice" else ("True", "False"))
    elif column.kind == "pattern":
        bad = ~cells.str.fullmatch(column.pattern)
    elif column.kind in ("int", "ints"):
        def whole(text: str) -> bool:
            parts = text.split(" ") if column.kind == "ints" else [text]
            return all(re.fullmatch(r"-?\d{1,19}", p) and (column.low is None or int(p) >= column.low)
                       and (column.high is None or int(p) <= column.high) for p in parts)
        bad = ~cells.map(whole).astype(bool)
    else:  # float: finite (or nan where allowed), within range
        def number(text: str) -> bool:
            try:
                value = float(text)
            except ValueError:
                return False
            if math.isnan(value):
                return column.nan
            return math.isfinite(value) and (column.low is None or value >= column.low) and \
                (column.high is None or value <= column.high)
        bad = ~cells.map(number).astype(bool)
    return bad & ~empty if column.optional else bad


def _allowed(column: Column) -> str:
    span = f" in [{column.low:g}, {column.high:g}]" if column.low is not None and column.high is not None else \
        f" >= {column.low:g}" if column.low is not None else ""
    text = {"name": "a non-empty label", "choice": f"one of {', '.join(column.choices)}",
            "bool": "True or False", "pattern": f"a split ({SPLIT.pattern})",
            "int": f"a whole number{span}", "ints": f"whole numbers{span}, space-separated",
            "float": f"a finite number{span}" + (" (or nan)" if column.nan else "")}[column.kind]
    return text + (" or empty" if column.optional else "")


def validate(path: Path, frame: pd.DataFrame, schema: TableSchema) -> None:
    """Refuse ``frame`` (``path`` read as text, "" for an empty cell) unless every column meets ``schema``."""
    names = [c.name for c in schema.columns]
    required = [c.name for c in schema.columns if not (schema.extra and c.optional)]
    missing = [c for c in required if c not in frame.columns]
    if missing or (not schema.extra and list(frame.columns) != names):
        raise UserError(f"{path}: columns {list(frame.columns)} are not the bundle format's {names}. Restore it "
                        "from git, or delete the bundle folder to collect it anew from the run folders.")
    for column in schema.columns:
        if column.name not in frame.columns:
            continue
        bad = _bad_cells(frame[column.name], column)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(f"{path}: row {row + 2}, column {column.name}: {frame[column.name].iloc[row][:40]!r} is "
                            f"not {_allowed(column)} ({int(bad.sum())} such cell(s)). Restore the file from git, or "
                            "delete the bundle folder to collect it anew from the run folders.")
    key = list(schema.key)
    repeated = frame[frame.duplicated(key, keep=False)]
    if len(repeated):
        first = repeated.iloc[0]
        same = repeated[(repeated[key] == first[key]).all(axis=1)]
        differ = len(same.drop_duplicates()) > 1
        raise UserError(f"{path}: {len(same)} rows for {', '.join(f'{k}={first[k]}' for k in key)}"
                        + (", with contradicting values" if differ else "") + f" (one row each is the format; "
                        f"{len(repeated)} repeated row(s) in all). Restore the file from git, or delete the bundle "
                        "folder to collect it anew from the run folders.")
