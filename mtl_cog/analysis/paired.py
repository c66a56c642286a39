"""Paired comparisons: each COG variant against its counterpart, and how stable the ranking is over seeds.

**Pairs.** A method names its counterpart in its config (``method.counterpart``, the pairing of
the COG paper's Tab. 1): COG-TS vs post-hoc TS on the baseline (``baseline+ts``), COG-VS vs
``baseline+vs``, COG-MS vs ``baseline+ms``, COG-TST vs ``tst``, COG-FC vs ``baseline``, COG+LS vs
``ls``. For a metric, the difference of a pair is taken per seed and task,
``d[s, t] = metric(variant, seed s, task t) - metric(counterpart, seed s, task t)``; runs of the
same seed share the data order and initialisation, so pairing removes that variance.

**Interval.** The seeds are the unit of replication: a seed draws the initialisation and the data
order of *all* tasks of a run at once, so the 40 attributes of one seed share a backbone and are
not 40 independent draws, while the tasks themselves are fixed (the same 40 attributes every
time; the quantity estimated is the mean difference over *these* tasks, in expectation over
seeds). So each seed's differences are averaged over tasks, ``x_s = mean_t d[s, t]``, and the
interval is Student's t interval on the S values ``x_s``: ``mean(x) ± t_{S-1, 0.975} sd(x) / sqrt(S)``
(a paired t interval). Under normally distributed seed effects its coverage is exact for any S >= 2
and any task structure, because task effects are either constant (they cancel into the estimand)
or averaged into ``x_s``. ``tests/test_paired_coverage.py`` checks it by simulation on the
protocol's designs (3 and 5 seeds, 1 and 40 tasks, seed- or task-level noise dominating): 94-96 %
for a nominal 95 %. A skewed seed distribution (centred exponential) gives ~88 %: with 3-5 seeds no
interval can check normality, so read a borderline interval as borderline.

It replaces a two-way bootstrap over seeds and tasks, which covered 69-77 % on 3 seeds and 84 % on
5 (its resampled means of 3 seeds are clipped to their range, and it has no small-sample
correction), yet ~100 % with 40 tasks and task noise (it resamples fixed tasks as if drawn at
random); the same test measures it. With fewer than ``MIN_SEEDS`` seeds there is no interval and the
verdict is "inconclusive": one seed says nothing about seed-to-seed variation, usually the larger
part.

**Rank spread.** The average rank over accuracy, NLL and Brier (``average_ranks``) is
computed per seed, on the seeds every method of the data set has, and summarised as mean, std
and range over seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats
from scipy.stats import rankdata

from mtl_cog.config import counterpart_identity
from mtl_cog.errors import ReportError
from mtl_cog.evaluation.metrics import lower_is_better

PAIRED_METRICS = ("nll", "brier", "ece@15", "accuracy")
CONFIDENCE = 0.95
MIN_SEEDS = 2  # a t interval needs a variance: at least two seeds
VARIANT, COUNTERPART, INCONCLUSIVE = "variant", "counterpart", "inconclusive"
RANK_METRICS = ("accuracy", "nll", "brier")


def seed_t_interval(differences: np.ndarray, confidence: float = CONFIDENCE):
    """(mean, low, high) of a (seeds, tasks) matrix of paired differences; see the module docstring.

    A stack of matrices (..., seeds, tasks) gives arrays of means and bounds (the coverage test
    uses that). The interval is NaN with fewer than ``MIN_SEEDS`` seeds.
    """
    d = np.asarray(differences, dtype=float)
    if d.ndim < 2 or d.size == 0:
        raise ValueError(f"differences must be a non-empty (seeds, tasks) matrix, got shape {d.shape}.")
    if not np.isfinite(d).all():
        raise ValueError("differences must be finite (a missing seed or task must be left out before).")
    per_seed = d.mean(axis=-1)
    n_seeds = per_seed.shape[-1]
    mean = per_seed.mean(axis=-1)
    if n_seeds < MIN_SEEDS:
        low = high = np.full_like(mean, np.nan)
    else:
        half = stats.t.ppf((1 + confidence) / 2, n_seeds - 1) * per_seed.std(axis=-1, ddof=1) / math.sqrt(n_seeds)
        low, high = mean - half, mean + half
    if d.ndim == 2:
        return float(mean), float(low), float(high)
    return mean, low, high


def verdict(mean: float, low: float, high: float, lower_better: bool) -> str:
    """Which side the interval favours: ``variant``, ``counterpart``, or ``inconclusive`` (contains 0, or none)."""
    if math.isnan(low) or low <= 0 <= high:
        return INCONCLUSIVE
    variant_lower = mean < 0
    return VARIANT if variant_lower == lower_better else COUNTERPART


def counterpart_pairs(configs: dict[str, dict]) -> dict[str, str]:
    """{method: counterpart} from runs' configs ({method: config dict}); methods without one are left out."""
    pairs = {}
    for method, config in configs.items():
        counterpart = (config.get("method") or {}).get("counterpart")
        if counterpart:  # under an aggregator, the counterpart trained with the same one
            pairs[method] = counterpart_identity(str(counterpart), config)
    return pairs


def _per_seed_task(scores: pd.DataFrame, dataset: str, method: str, metric: str) -> pd.DataFrame:
    rows = scores[(scores["dataset"] == dataset) & (scores["method"] == method) & (scores["task"] != "mean")]
    return rows.groupby(["seed", "task"])[metric].mean().unstack("task")  # runs sharing a seed are averaged


def paired_differences(scores: pd.DataFrame, pairs: dict[str, str],
                       metrics: tuple[str, ...] = PAIRED_METRICS) -> pd.DataFrame:
    """One row per (data set, variant, metric): mean difference to the counterpart and its 95 % t interval.

    ``better`` says which side the interval excludes zero for (``variant``/``counterpart``), or
    ``inconclusive``: the interval contains zero, or fewer than ``MIN_SEEDS`` seeds are shared
    (no interval: the seed-to-seed variation, usually the larger part, is not measured). Pairs
    whose counterpart is missing, or that share no seed, are left out.
    """
    rows = []
    for dataset in dict.fromkeys(scores["dataset"]):
        present = set(scores.loc[scores["dataset"] == dataset, "method"])
        for method, counterpart in pairs.items():
            if method not in present or counterpart not in present:
                continue
            for metric in metrics:
                if metric not in scores.columns:
                    continue
                mine = _per_seed_task(scores, dataset, method, metric)
                theirs = _per_seed_task(scores, dataset, counterpart, metric)
                seeds = mine.index.intersection(theirs.index)
                tasks = mine.columns.intersection(theirs.columns)
                d = (mine.loc[seeds, tasks] - theirs.loc[seeds, tasks]).to_numpy(dtype=float)
                if d.size == 0 or not np.isfinite(d).all():
                    continue
                mean, low, high = seed_t_interval(d)
                better = verdict(mean, low, high, lower_is_better(metric))
                rows.append({"dataset": dataset, "variant": method, "counterpart": counterpart, "metric": metric,
                             "mean_difference": mean, "ci_low": low, "ci_high": high, "n_seeds": len(seeds),
                             "n_tasks": len(tasks), "better": better})
    return pd.DataFrame(rows, columns=["dataset", "variant", "counterpart", "metric", "mean_difference", "ci_low",
                                       "ci_high", "n_seeds", "n_tasks", "better"])


def rank_spread(scores: pd.DataFrame) -> pd.DataFrame:
    """Per data set and method: average rank per seed (on the seeds all its methods share), mean/std/min/max."""
    rows = []
    means = scores[scores["task"] == "mean"]
    for dataset, group in means.groupby("dataset", sort=False):
        methods = list(dict.fromkeys(group["method"]))
        seed_sets = [set(group.loc[group["method"] == m, "seed"]) for m in methods]
        common = sorted(set.intersection(*seed_sets))
        per_seed = []
        for seed in common:
            table = group[group["seed"] == seed].groupby("method")[["accuracy", "nll", "brier"]].mean()
            per_seed.append(average_ranks(table)["avg_rank"])
        if not per_seed:
            continue
        ranks = pd.concat(per_seed, axis=1)
        for method in methods:
            values = ranks.loc[method].to_numpy(dtype=float)
            rows.append({"dataset": dataset, "method": method, "avg_rank_mean": values.mean(),
                         "avg_rank_std": values.std(ddof=1) if len(values) > 1 else np.nan,
                         "avg_rank_min": values.min(), "avg_rank_max": values.max(), "n_seeds": len(values)})
    return pd.DataFrame(rows, columns=["dataset", "method", "avg_rank_mean", "avg_rank_std", "avg_rank_min",
                                       "avg_rank_max", "n_seeds"])


def average_ranks(means: pd.DataFrame, metrics: tuple[str, ...] = RANK_METRICS) -> pd.DataFrame:
    """Rank the rows (methods) of ``means`` on each metric (1 = best, ties averaged) and average.

    Returns ``rank_<metric>`` columns, ``avg_rank`` and ``top_ranked`` (True for every method
    sharing the lowest average rank). Accuracy is ranked high-to-low, the others low-to-high.
    """
    out = pd.DataFrame(index=means.index)
    for metric in metrics:
        values = means[metric].to_numpy(dtype=float)
        if np.isnan(values).any():
            raise ReportError(f"cannot rank on {metric}: no value for {', '.join(means.index[np.isnan(values)])}.")
        out[f"rank_{metric}"] = rankdata(values if lower_is_better(metric) else -values, method="average")
    out["avg_rank"] = out[[f"rank_{m}" for m in metrics]].mean(axis=1)
    out["top_ranked"] = np.isclose(out["avg_rank"], out["avg_rank"].min())
    return out
