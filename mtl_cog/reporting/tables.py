"""Comparison tables from run records (``run_records``): mean ± std over seeds, average ranks, per-task tables.

Every variant of a run is scored on its test set. Prediction files are preferred because they are
re-scored at the bin counts the report asks for and, when they hold ``true_probs/<t>``, also against
the truth (mtl_cog/evaluation/truth.py); metric CSVs only give what they contain (missing bin counts
stay empty).

The summary follows the paper (Sec. 4): per data set, one row per method, every metric as mean
and standard deviation over seeds (sample std, ddof=1; 0 for one seed), and the unweighted
**average rank** over accuracy, NLL and Brier (Javaloy et al., 2025): each metric's mean over
seeds is ranked across the data set's methods (1 = best; ties share the average of the ranks
they span, as ``scipy.stats.rankdata(method="average")``), and the three ranks are averaged. The
method(s) with the lowest average rank are marked *top-ranked*. Tables are written as CSV and
Markdown here, as LaTeX in ``mtl_cog.reporting.latex``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.analysis.paired import average_ranks
from mtl_cog.bundles.run_records import RunRecord, Variant
from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.groups import score_with_groups
from mtl_cog.evaluation.metrics import (
    BASE_METRICS,
    BINNED_FAMILIES,
    NORMS,
    metrics_frame,
)
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.predictions import load_predictions
from mtl_cog.evaluation.truth import labelled_truth_metrics
from mtl_cog.progress import track

ID_COLUMNS = ["dataset", "method", "seed", "run", "task"]


def score_variant(variant: Variant, bins: list[int], groups: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows per task + "mean": every metric at ``bins``, and truth metrics where p* is known; with ``groups``
    (the run's eval.groups) the worst-group, gap and multicalibration columns too."""
    if variant.predictions is None:
        # keep the task and the numeric metric columns (a CSV may carry labels such as a split name)
        numeric = variant.metrics.drop(columns=["task"]).select_dtypes("number").columns
        frame = variant.metrics[["task", *numeric]].copy()
        if "mean" not in set(frame["task"]):
            numeric = frame.drop(columns=["task"]).mean(numeric_only=True)
            frame = pd.concat([frame, pd.DataFrame([{"task": "mean", **numeric}])], ignore_index=True)
        return frame
    predictions = load_predictions(variant.predictions)
    scores = score_with_groups(predictions.task_names, predictions.logits, predictions.labels, bins, DEFAULT_PAIRS,
                               groups)
    scores.pop("groups", None)  # the cells stay in the run's group_metrics.csv
    truth = labelled_truth_metrics(predictions, bins)  # partly labelled: the rows labelled in every task
    if truth is not None:
        for task in scores["tasks"]:
            scores["tasks"][task].update(truth["tasks"][task])
        scores["mean"].update(truth["mean"])
        scores.setdefault("multitask", {}).update(truth.get("multitask", {}))
    return metrics_frame(scores)  # the multi-task metrics are columns of the "mean" row


def score_runs(records: list[RunRecord], bins: list[int]) -> pd.DataFrame:
    frames = []
    for record in track(records, "compare: scoring runs"):
        for variant in record.variants:
            frame = score_variant(variant, bins, (record.config.get("eval") or {}).get("groups") or ())
            frame.insert(0, "run", str(record.run_dir))
            frame.insert(0, "seed", record.seed)
            frame.insert(0, "method", variant.method)
            frame.insert(0, "dataset", record.dataset)
            frames.append(frame)
    scores = pd.concat(frames, ignore_index=True)
    return scores[ID_COLUMNS + [c for c in scores.columns if c not in ID_COLUMNS]]


def metric_columns(scores: pd.DataFrame) -> list[str]:
    return [c for c in scores.columns if c not in ID_COLUMNS]


def _mean_std(frame: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    grouped = frame.groupby(keys, sort=False)
    means = grouped[columns].mean()
    # A spread over seeds needs two distinct seeds: runs repeating one seed measure nothing but
    # nondeterminism, so their std is left empty (NaN) rather than shown as a seed spread.
    counts = grouped["seed"].agg(n_seeds="nunique", n_runs="count",
                                 seeds=lambda s: " ".join(str(v) for v in sorted(set(s))))
    stds = grouped[columns].std(ddof=1)
    stds = stds.where((counts["n_seeds"] >= 2).to_numpy()[:, None] & means.notna().to_numpy())
    stds.columns = [f"{c}_std" for c in columns]
    return pd.concat([counts, means, stds], axis=1)


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per data set and method: every metric (mean and ``_std`` over seeds), ranks, top-ranked."""
    task_mean = scores[scores["task"] == "mean"]
    columns = [c for c in metric_columns(scores) if task_mean[c].notna().any()]
    summary = _mean_std(task_mean, ["dataset", "method"], columns)
    ranked = [average_ranks(group.droplevel(0)).assign(dataset=dataset).set_index("dataset", append=True)
              .swaplevel() for dataset, group in summary.groupby(level="dataset", sort=False)]
    return pd.concat([summary, pd.concat(ranked)], axis=1).reset_index()


def calibration_error_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Long table: data set, method, norm, bins, mean, std, rank.

    ``norm`` is every binned error family (ece, rmsce, mce, adaece, classwise_ece, the multi-task
    pooled_ece, worst_task_ece, p90_task_ece, and their nf_* noise-free versions where known).

    ``rank`` orders the data set's methods for that norm and bin count (1 = lowest error), so a
    reader sees how rankings move with the number of bins (paper, App. C.3).
    """
    task_mean = scores[scores["task"] == "mean"]
    rows = []
    for column in metric_columns(scores):
        norm, _, bins = column.partition("@")
        if not bins or norm.removeprefix("nf_") not in BINNED_FAMILIES or task_mean[column].isna().all():
            continue
        for (dataset, method), group in task_mean.groupby(["dataset", "method"], sort=False):
            values = group[column].dropna()
            if values.empty:  # e.g. noise-free errors of a data set without true probabilities
                continue
            n_seeds = group.loc[values.index, "seed"].nunique()
            rows.append({"dataset": dataset, "method": method, "norm": norm, "bins": int(bins),
                         "mean": values.mean(), "std": values.std(ddof=1) if n_seeds >= 2 else np.nan,
                         "n_seeds": n_seeds})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["rank"] = table.groupby(["dataset", "norm", "bins"])["mean"].rank(method="average")
    return table.sort_values(["dataset", "norm", "bins", "rank"], kind="stable").reset_index(drop=True)


def per_task_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Multi-task data sets only: every metric of every task and method, mean and ``_std`` over seeds."""
    tasks = scores[scores["task"] != "mean"]
    multi = tasks.groupby("dataset")["task"].nunique()
    tasks = tasks[tasks["dataset"].isin(multi[multi > 1].index)]
    if tasks.empty:
        return pd.DataFrame(columns=["dataset", "method", "task"])
    columns = [c for c in metric_columns(scores) if tasks[c].notna().any()]
    return _mean_std(tasks, ["dataset", "method", "task"], columns).reset_index()


def _cell(mean: float, std: float, digits: int = 4) -> str:
    """``mean ± std``; the ± only where a std exists (at least two distinct seeds)."""
    if pd.isna(mean):
        return "–"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def seeds_cell(row: pd.Series) -> str:
    """Distinct seeds, and the run count when runs repeat a seed (``1 (3 runs)``)."""
    runs = row.get("n_runs", row["n_seeds"])
    return str(row["n_seeds"]) if pd.isna(runs) or runs == row["n_seeds"] else f"{row['n_seeds']} ({runs} runs)"


def summary_markdown(summary: pd.DataFrame, bins: int, truth_bins: int | None = None) -> str:
    """One table per data set: accuracy, NLL, Brier, ECE/RMSCE/MCE@bins, average rank; top-ranked in bold."""
    columns = [*BASE_METRICS, *(f"{n}@{bins}" for n in NORMS)]
    headers = ["method", "seeds", "accuracy ↑", "NLL ↓", "Brier ↓", f"ECE@{bins} ↓", f"RMSCE@{bins} ↓",
               f"MCE@{bins} ↓", "avg rank ↓"]
    lines = ["# Comparison of methods", "",
             "Test-set metrics, mean ± std over distinct seeds (no ± with a single seed; unweighted mean over "
             "tasks for multi-task data sets). Only runs of the same protocol (data options, epochs, backbone, "
             "image size) are ranked together. "
             "Average rank over accuracy, NLL and Brier (1 = best; ties share the average rank); "
             "**bold ★** = top-ranked.", ""]
    for dataset, group in summary.groupby("dataset", sort=False):
        lines += [f"## {dataset}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        for _, row in group.sort_values("avg_rank", kind="stable").iterrows():
            cells = [_cell(row.get(c, np.nan), row.get(f"{c}_std", np.nan)) for c in columns]
            name, rank = str(row["method"]), f"{row['avg_rank']:.2f}"
            if row["top_ranked"]:
                name, rank = f"**{name} ★**", f"**{rank}**"
            lines.append("| " + " | ".join([name, seeds_cell(row), *cells, rank]) + " |")
        lines.append("")
        if truth_bins is not None and f"nf_ece@{truth_bins}" in group and group[f"nf_ece@{truth_bins}"].notna().any():
            lines += truth_markdown(group, truth_bins)
    return "\n".join(lines)


def truth_markdown(group: pd.DataFrame, bins: int) -> list[str]:
    """Against the true probabilities: label-based ECE next to its noise-free counterpart and |p̂ − p*|."""
    lines = ["Against the true probabilities p* (mtl_cog/evaluation/truth.py): label-based ECE, the noise-free "
             "calibration error (same bins, mean p* instead of labels), mean |p̂ − p*|, KL(p*‖p̂).", "",
             f"| method | ECE@{bins} (labels) | noise-free CE@{bins} | mean abs(p̂ − p*) | KL(p*‖p̂) |",
             "|---|---|---|---|---|"]
    for _, row in group.iterrows():
        if pd.isna(row.get(f"nf_ece@{bins}")):
            continue
        cells = [_cell(row[c], row[f"{c}_std"]) for c in (f"ece@{bins}", f"nf_ece@{bins}", "prob_error", "kl_true")]
        lines.append("| " + " | ".join([str(row["method"]), *cells]) + " |")
    first = group[group["bayes_nll"].notna()].iloc[0]
    lines += ["", "Bayes floors (the scores of p* itself): on this test set's labels accuracy "
              f"{first['bayes_accuracy']:.4f}, NLL {first['bayes_nll']:.4f}, Brier {first['bayes_brier']:.4f}; "
              f"in expectation over labels accuracy {first['bayes_accuracy_exp']:.4f}, NLL "
              f"{first['bayes_nll_exp']:.4f}, Brier {first['bayes_brier_exp']:.4f}.", ""]
    return lines


def markdown_table(table: pd.DataFrame) -> str:
    """A Markdown table (pandas' to_markdown needs the tabulate package, which we do not require)."""
    def cell(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


WORST_TASKS_SHOWN = 5


def worst_tasks_line(task_metrics: dict[str, dict[str, float]], bins: list[int], k: int = WORST_TASKS_SHOWN) -> str:
    """The console line after training: the ``k`` worst-calibrated tasks by ECE; "" for a single task."""
    if len(task_metrics) < 2:
        return ""
    n_bins = SUMMARY_BINS if SUMMARY_BINS in bins else bins[0]
    worst = worst_tasks(task_metrics, f"ece@{n_bins}", k)
    return f"worst-calibrated tasks (test ECE@{n_bins}): " + ", ".join(f"{task} {value:.4f}" for task, value in worst)


def worst_tasks(task_metrics: dict[str, dict[str, float]], metric: str, k: int) -> list[tuple[str, float]]:
    """The ``k`` tasks with the largest ``metric`` (e.g. ece@15), worst first; tasks without a value skipped."""
    values = [(task, float(m[metric])) for task, m in task_metrics.items()
              if metric in m and m[metric] is not None and np.isfinite(m[metric])]
    return sorted(values, key=lambda item: (-item[1], item[0]))[:k]
