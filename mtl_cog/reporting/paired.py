"""Paired comparisons: each COG variant against its counterpart, and how stable the ranking is over seeds.

**Pairs.** A method names its counterpart in its config (``method.counterpart``, the pairing of
the COG paper's Tab. 1): COG-TS vs post-hoc TS on the baseline (``baseline+ts``), COG-VS vs
``baseline+vs``, COG-MS vs ``baseline+ms``, COG-TST vs ``tst``, COG-FC vs ``baseline``, COG+LS vs
``ls``. For a metric, the difference of a pair is taken per seed and task,
``d[s, t] = metric(variant, seed s, task t) - metric(counterpart, seed s, task t)``; runs of the
same seed share the data order and initialisation, so pairing removes that variance.

**Interval.** The mean of ``d`` with a 95 % bootstrap interval over seeds x tasks. Seeds and
tasks are *crossed* factors (all 40 attributes of one seed share a backbone, so they are not 40
independent draws), so each bootstrap replicate resamples seeds and tasks independently, with
replacement, and averages the selected sub-matrix (a two-way "pigeonhole" bootstrap, Owen 2007).
With one task this is the ordinary bootstrap over seeds. ``scipy.stats.bootstrap`` resamples one
axis of independent observations only, hence these few lines of numpy. The interval is the
percentile interval (with 3 seeds and one task only 10 distinct replicate means exist: read it as
a rough guide, and the report prints n).

**Rank spread.** The average rank over accuracy, NLL and Brier (``tables.average_ranks``) is
computed per seed, on the seeds every method of the data set has, and summarised as mean, std
and range over seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.config import counterpart_identity
from mtl_cog.evaluation.metrics import lower_is_better
from mtl_cog.reporting.tables import average_ranks

PAIRED_METRICS = ("nll", "brier", "ece@15", "accuracy")
N_RESAMPLES = 10_000
CONFIDENCE = 0.95


def crossed_bootstrap(differences: np.ndarray, n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE,
                      seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of a (seeds, tasks) matrix of paired differences; see the module docstring."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"differences must be a non-empty (seeds, tasks) matrix, got shape {d.shape}.")
    if not np.isfinite(d).all():
        raise ValueError("differences must be finite (a missing seed or task must be left out before).")
    n_seeds, n_tasks = d.shape
    rng = np.random.default_rng(seed)
    # Resampling with replacement = multinomial counts; mean of the sub-matrix = w' D v / (S T).
    w = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=n_resamples)
    v = rng.multinomial(n_tasks, np.full(n_tasks, 1 / n_tasks), size=n_resamples)
    replicates = np.einsum("bs,st,bt->b", w, d, v) / (n_seeds * n_tasks)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(replicates, [alpha, 1 - alpha])
    # A resampled mean lies within [min, max] of the differences; clipping removes the rounding of
    # the weighted sums (a constant matrix gets exactly the zero-width interval it has).
    low, high = np.clip([low, high], d.min(), d.max())
    mean = float(np.clip(d.mean(), d.min(), d.max()))
    return mean, float(min(low, mean)), float(max(high, mean))


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


def paired_differences(scores: pd.DataFrame, pairs: dict[str, str], metrics: tuple[str, ...] = PAIRED_METRICS,
                       seed: int = 0) -> pd.DataFrame:
    """One row per (data set, variant, metric): mean difference to the counterpart and its 95 % interval.

    ``better`` says which side the interval excludes zero for (``variant``/``counterpart``), or
    ``unclear``. With a single shared seed there is no interval (NaN) and no verdict: the
    seed-to-seed variation, usually the larger part, is not measured. Pairs whose counterpart is
    missing, or that share no seed, are left out.
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
                mean, low, high = crossed_bootstrap(d, seed=seed)
                sign = -1 if lower_is_better(metric) else 1  # sign * difference > 0: the variant is better
                excludes_zero = low > 0 or high < 0
                better = ("variant" if sign * mean > 0 else "counterpart") if excludes_zero else "unclear"
                if len(seeds) < 2:  # no seed-to-seed variation measured: no interval, no verdict
                    low, high, better = np.nan, np.nan, "n/a (one seed)"
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
