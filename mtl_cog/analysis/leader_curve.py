"""The leader-rate curve's numbers: each metric against the leader/follower ratio, with intervals (drawn by
``reporting/curve_figures.py``).

Input: one row per (arm, ratio, seed, split, task) with the metrics of that run's best checkpoint
(``arm``: the COG method, or a reference method drawn as a horizontal band: the tuned baseline,
post-hoc TS on it, the method's own counterpart). Per ratio, a metric's value is the mean over
seeds of the task-averaged metric, with the same 95 % t interval over seeds as the paired
comparisons (``mtl_cog.analysis.paired.seed_t_interval``: seeds are the unit of replication).

Against the reference (the method's counterpart), the *paired* difference per ratio: runs of the
same seed share initialisation and data order, so the difference removes that variance; verdict
as in the report (``variant``, ``counterpart``, ``inconclusive``). And against the method itself
at ratio 1 (no hierarchy, the same follower rate): the counterpart was tuned on its own, often to
another follower rate, so only this second comparison isolates what the hierarchy does (on
fashion_mnist, COG-FC's gain over the tuned baseline came from its follower rate, not its ratio).

The best ratio is chosen on **validation** NLL (as the fair protocol chooses), never on test: a
choice made on the numbers it is judged on would flatter it.
"""

from __future__ import annotations

import pandas as pd

from mtl_cog.analysis.paired import seed_t_interval, verdict
from mtl_cog.bundles.bundle import Bundle, wide_scores
from mtl_cog.evaluation.metrics import lower_is_better

CURVE_METRICS = ("nll", "brier", "ece@15", "smece", "accuracy")
METRIC_TITLES = {"nll": "test NLL", "brier": "test Brier", "ece@15": "test ECE (15 bins)", "smece": "test smooth ECE",
                 "accuracy": "test accuracy"}


def _matrix(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """(seeds, tasks) of one arm at one ratio."""
    return rows.groupby(["seed", "task"])[metric].mean().unstack("task")


def _select(scores: pd.DataFrame, arm: str, ratio: float | None, split: str = "test") -> pd.DataFrame:
    rows = scores[(scores["arm"] == arm) & (scores["split"] == split)]
    if ratio is None:
        return rows[rows["ratio"].isna()]
    # the ratio as a run folder names it (6 significant digits; distinct names are checked when planned)
    return rows[[f"{r:.6g}" == f"{ratio:.6g}" if pd.notna(r) else False for r in rows["ratio"]]]


def curve_table(scores: pd.DataFrame, metrics: tuple[str, ...] = CURVE_METRICS) -> pd.DataFrame:
    """One row per (arm, ratio, metric): mean over seeds of the task mean, 95 % t interval, seeds, tasks."""
    rows = []
    points = scores[scores["split"] == "test"][["arm", "ratio"]].drop_duplicates()
    for point in points.itertuples():
        ratio = None if pd.isna(point.ratio) else float(point.ratio)
        selected = _select(scores, point.arm, ratio)
        for metric in metrics:
            matrix = _matrix(selected, metric).dropna(axis=1)
            mean, low, high = seed_t_interval(matrix.to_numpy(dtype=float))
            rows.append({"arm": point.arm, "ratio": ratio, "metric": metric, "mean": mean, "ci_low": low,
                         "ci_high": high, "n_seeds": matrix.shape[0], "n_tasks": matrix.shape[1]})
    columns = ["arm", "ratio", "metric", "mean", "ci_low", "ci_high", "n_seeds", "n_tasks"]
    return pd.DataFrame(rows, columns=columns).sort_values(["arm", "ratio", "metric"], na_position="last",
                                                           kind="stable", ignore_index=True)


def paired_to_reference(scores: pd.DataFrame, method: str, reference: str, ratios: list[float],
                        metrics: tuple[str, ...] = CURVE_METRICS, reference_ratio: float | None = None) -> pd.DataFrame:
    """Per ratio and metric: method minus reference on the seeds both have, 95 % t interval, verdict.

    ``reference_ratio``: the reference is ``reference``'s runs at that ratio (the method itself at
    ratio 1), not a reference arm's; the column ``reference`` then reads e.g. ``cog_fc@1``.
    """
    rows = []
    theirs_all = _select(scores, reference, reference_ratio)
    label = reference if reference_ratio is None else f"{reference}@{reference_ratio:g}"
    for ratio in ratios if not theirs_all.empty else []:
        mine_all = _select(scores, method, ratio)
        for metric in metrics if not mine_all.empty else []:
            mine, theirs = _matrix(mine_all, metric), _matrix(theirs_all, metric)
            seeds, tasks = mine.index.intersection(theirs.index), mine.columns.intersection(theirs.columns)
            if len(seeds) == 0 or len(tasks) == 0:
                continue
            d = (mine.loc[seeds, tasks] - theirs.loc[seeds, tasks]).to_numpy(dtype=float)
            mean, low, high = seed_t_interval(d)
            rows.append({"ratio": ratio, "metric": metric, "reference": label, "mean_difference": mean,
                         "ci_low": low, "ci_high": high, "n_seeds": len(seeds),
                         "better": verdict(mean, low, high, lower_is_better(metric))})
    return pd.DataFrame(rows, columns=["ratio", "metric", "reference", "mean_difference", "ci_low", "ci_high",
                                       "n_seeds", "better"])


def best_ratio(scores: pd.DataFrame, method: str) -> tuple[float | None, pd.Series]:
    """(ratio with the lowest mean validation NLL, the validation NLL per ratio); None if none finished."""
    rows = scores[(scores["arm"] == method) & (scores["split"] == "val") & scores["ratio"].notna()]
    if rows.empty:
        return None, pd.Series(dtype=float)
    per_seed = rows.groupby(["ratio", "seed"])["nll"].mean()  # the task mean of each run
    per_ratio = per_seed.groupby(level="ratio").mean()
    return float(per_ratio.idxmin()), per_ratio


def curves(bundle: Bundle) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(curve table, paired table) over every (data set, method) with leader-ratio runs in the bundle."""
    runs = bundle.done()
    curve_runs = runs[runs["role"] == "curve"]
    if curve_runs.empty:
        return pd.DataFrame(), pd.DataFrame()
    scores = wide_scores(bundle, curve_runs)
    scores = scores[scores["task"] != "mean"].rename(columns={"method": "arm"})
    tables, pairs = [], []
    counterparts = bundle.campaign.get("counterparts", {})
    for data, group in scores.groupby("data", sort=True):
        methods = sorted(set(group.loc[group["ratio"].notna(), "arm"]))
        tables.append(curve_table(group).assign(data=data))
        for method in methods:
            ratios = sorted(group.loc[(group["arm"] == method) & group["ratio"].notna(), "ratio"].unique())
            ref = counterparts.get(method, "baseline")
            pairs.append(paired_to_reference(group, method, ref, ratios).assign(data=data, method=method))
            below = [r for r in ratios if r < 1]
            pairs.append(paired_to_reference(group, method, method, below, reference_ratio=1.0)
                         .assign(data=data, method=method))
    # the reference runs alone (a curve lane records them first, reused from the protocol): no ratio to pair yet
    return pd.concat(tables, ignore_index=True), pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame()
