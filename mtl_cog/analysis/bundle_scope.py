"""What a campaign's headline is scoped to, read from its bundle alone: per run, whether it settled under the
convergence rule (``convergence``, ``bundles/trajectories.convergence_of_curves``) and per role, data set, draw and
method how many did (``convergence_counts``); per role and data set, the runs by status, the split sizes, epochs and
threads of the finished ones, how many settled and the hours their epochs took (``scope``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.bundles.bundle import Bundle
from mtl_cog.bundles.trajectories import convergence_of_curves


def convergence(bundle: Bundle) -> pd.DataFrame:
    runs = bundle.done()
    curves = bundle.curves
    rows = []
    for run in runs.itertuples():
        result = convergence_of_curves(curves[curves["run"] == run.run])
        rows.append({"role": run.role, "data": run.data, "draw": "" if pd.isna(run.draw) else str(run.draw),
                     "method": run.method, "run": run.run,
                     "converged": None if result is None else result.converged,
                     "calibrator_move": np.nan if result is None or result.calibrator_move is None
                     else float(result.calibrator_move),
                     "why_not": "" if result is None else result.why_not()})
    return pd.DataFrame(rows)


def convergence_counts(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    grouped = table.groupby(["role", "data", "draw", "method"], sort=True)
    return grouped.agg(runs=("run", "size"), converged=("converged", lambda c: int((c == True).sum())),  # noqa: E712
                       calibrator_move_max=("calibrator_move", "max")).reset_index()


def _values(column: pd.Series) -> str:
    """The distinct values of a runs.csv column as one cell: ``20``, ``2-20`` for a numeric range."""
    values = pd.Series([v for cell in column.dropna().astype(str) for v in cell.split()])  # "1 2": a resumed run
    if values.empty:
        return ""
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all():
        low, high = int(numbers.min()), int(numbers.max())
        return str(low) if low == high else f"{low}-{high}"
    return " ".join(sorted(set(values)))


def scope(bundle: Bundle, conv: pd.DataFrame) -> pd.DataFrame:
    """Per role and data set, what a headline drawn from the bundle is scoped to: how many runs ended how, the
    split sizes and epochs the finished runs trained with, their torch threads, how many settled, and the hours
    their epochs took (``epoch_hours``: runs.csv's ``wall_s``, the training and validation time of every epoch
    from ``timing.jsonl``, without start-up, test scoring or post-hoc fits; times ``threads`` for core-hours; of
    every run, pruned and failed ones included where they recorded it (rows collected by code older than cc43bb9
    did not); a run recorded from another campaign's bundle, ``campaign.json``'s ``reused``, is counted in ``reused``,
    not in the hours, which its own campaign counts). ``untimed`` counts the trained runs that recorded no time,
    and ``untimed_hours_est`` estimates theirs: the epochs ``trials.csv`` says they trained, at the median seconds per
    epoch of the same role's timed runs (an estimate, kept apart from the measured ``epoch_hours``)."""
    runs = bundle.runs
    if runs.empty:
        return pd.DataFrame()
    rows = []
    reused = set(bundle.campaign.get("reused", {}))
    trial_epochs = _trial_epochs(bundle.trials)
    for (role, data), group in runs.groupby(["role", "data"], sort=True):
        done = group[group["status"] == "done"]
        trained = group[~group["run"].isin(reused)]
        judged = conv[(conv["role"] == role) & (conv["data"] == data) & conv["converged"].notna()] \
            if "converged" in conv else pd.DataFrame(columns=["converged"])  # no finished run: nothing to judge
        ended = group["status"].value_counts()
        sizes = {column: _values(done[column]) for column in ("train_size", "val_size", "test_size")}
        rows.append({"role": role, "data": data, "runs": len(group), "done": len(done),
                     "pruned": int(ended.get("pruned", 0)), "failed": int(ended.get("failed", 0)), **sizes,
                     "epochs": _values(done["epochs_run"]), "threads": _values(done["threads"]),
                     "converged": f"{int((judged['converged'] == True).sum())} of {len(judged)}",  # noqa: E712
                     "reused": int(done["run"].isin(reused).sum()),
                     "epoch_hours": float(pd.to_numeric(trained["wall_s"], errors="coerce").sum()) / 3600,
                     **_untimed(trained, trial_epochs)})
    return pd.DataFrame(rows)


def _trial_epochs(trials: pd.DataFrame) -> pd.Series:
    """Epochs each trial run trained, by its runs.csv name (``<study>-<run>``); a retry continues its run's folder,
    so a run's epochs are its rows' largest."""
    if trials.empty or not {"study", "run", "epochs_trained"} <= set(trials):
        return pd.Series(dtype=float)
    names = trials["study"].astype(str) + "-" + trials["run"].astype(str)
    return pd.to_numeric(trials["epochs_trained"], errors="coerce").groupby(names).max()


def _untimed(trained: pd.DataFrame, trial_epochs: pd.Series) -> dict:
    seconds = pd.to_numeric(trained["wall_s"], errors="coerce")
    timed_epochs = pd.to_numeric(trained.loc[seconds.notna(), "epochs_run"], errors="coerce")
    untimed = trained.loc[seconds.isna(), "run"]
    per_epoch = (seconds[timed_epochs.index] / timed_epochs).median()  # median: a paused run inflates a mean
    epochs = trial_epochs.reindex(untimed)  # a run trials.csv does not know: no estimate (empty), not a low one
    hours = epochs.sum(min_count=len(epochs)) * per_epoch / 3600 if len(untimed) else 0.0
    return {"untimed": len(untimed), "untimed_hours_est": float(hours)}
