"""Calibration inside subgroups, and multicalibration: is every group calibrated, not only everyone on average?

``eval.groups: [Male, Young]`` names tasks of a multi-task data set whose labels define groups: a
group is one value of one group task ("Male=0", "Male=1", ...). Inside every group, every *other*
task is scored (a task used as a group is not scored against itself: inside "Male=1" its labels
are constant) with the cell metrics ``CELL_METRICS``, computed as the overall ones
(mtl_cog.evaluation.metrics; one group holding everyone gives the overall values), except that
``smece`` inside a group is smECE at the task's bandwidth σ* on the whole split (one smoothing
scale for all groups of a task; ``group_metrics``). Per task:

    worst_group_ece@15  = max over groups g of ECE@15 inside g
    group_gap_ece@15    = max over group tasks of (max − min over its values of ECE@15)
    worst_group_accuracy, group_gap_accuracy: the same for accuracy (worst = lowest)
    multicalibration_smece = max over groups g of smECE inside g

and their unweighted means over tasks. The last is the multicalibration error as Hansen et al.
("When is multicalibration post-processing necessary?", NeurIPS 2024) report it: the largest
group-conditional smooth calibration error (Błasiok & Nakkiran, 2023) over the groups — a model
is multicalibrated when no group it is asked about is miscalibrated (Hébert-Johnson et al., 2018).

A group with no samples gets no metrics and the status "no samples"; a group in which the scored
task has one class only is scored (its calibration error is still one) and marked "one class
only". A task left with fewer than two non-empty groups of a group task has no gap (an empty
cell, never 0 or NaN).
"""

from __future__ import annotations

import difflib

import numpy as np
from scipy.special import expit, log_softmax

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.binning import CLAMP, SortedRows, errors_from_sums
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.smooth_ece import smooth_ece_at, smooth_ece_sorted

ECE = f"ece@{SUMMARY_BINS}"
CELL_METRICS = ("accuracy", "nll", "brier", ECE, "smece")
SUMMARY_METRICS = (f"worst_group_{ECE}", f"group_gap_{ECE}", "worst_group_accuracy", "group_gap_accuracy",
                   "multicalibration_smece")
NO_SAMPLES, ONE_CLASS, OK = "no samples", "one class only", "ok"


def check_groups(groups: list[str], task_names: list[str] | tuple[str, ...], where: str = "eval.groups") -> None:
    """Refuse a group that is not a task of the data set (with the closest names), or a repeated one."""
    for name in groups:
        if name not in task_names:
            close = difflib.get_close_matches(name, list(task_names), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{where}: {name!r} is not a task of this data set.{hint} Groups are task names: "
                              f"{', '.join(task_names[:12])}{' ...' if len(task_names) > 12 else ''}.")
    if len(set(groups)) != len(groups):
        raise ConfigError(f"{where}: {groups} names a task twice.")
    if groups and len(task_names) < 2:
        raise ConfigError(f"{where}: groups need a multi-task data set (a group task is not scored against itself).")


def _num_values(logits: np.ndarray) -> int:
    return 2 if np.ndim(logits) == 1 else logits.shape[1]


def _per_sample(logits: list[np.ndarray], labels: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per task and sample (T, N): the calibration event (confidence, outcome), correctness, NLL and Brier terms.

    The conventions of mtl_cog.evaluation.metrics: a binary task is calibrated on (p, y), a K-class
    task on (top-label confidence, correctness); confidences clamped to [1e-7, 1 − 1e-7]. Binary
    tasks are computed together; their NLL as metrics does it, softplus(z) − y z with
    softplus(z) = max(z, 0) − log max(p, 1 − p).
    """
    keys = ("confidence", "outcome", "correct", "nll", "brier")
    rows = {key: np.empty((len(logits), len(labels[0]))) for key in keys}
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    if binary:
        z = np.stack([np.asarray(logits[t], dtype=np.float64) for t in binary])
        y = np.stack([np.asarray(labels[t]) for t in binary]) > 0
        p = expit(z)
        rows["confidence"][binary], rows["outcome"][binary] = p, y
        rows["correct"][binary] = (z > 0) == y
        rows["nll"][binary] = np.maximum(z, 0) - np.log(np.maximum(p, 1 - p)) - y * z
        rows["brier"][binary] = 2 * (p - y) ** 2
    for t, z in enumerate(logits):
        if np.ndim(z) == 2:
            y = np.asarray(labels[t])
            log_p = log_softmax(np.asarray(z, dtype=np.float64), axis=1)
            probs = np.exp(log_p)
            predicted = probs.argmax(1)
            correct = predicted == y
            rows["confidence"][t] = probs[np.arange(len(y)), predicted]
            rows["outcome"][t] = rows["correct"][t] = correct
            rows["nll"][t] = -log_p[np.arange(len(y)), y]
            probs[np.arange(len(y)), y] -= 1
            rows["brier"][t] = (probs**2).sum(1)
    np.clip(rows["confidence"], CLAMP, 1 - CLAMP, out=rows["confidence"])
    return rows


def group_metrics(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray],
                  groups: list[str], bandwidths: dict[str, float] | None = None) -> dict:
    """{"cells": [row, ...], "tasks": {task: {summary metric: value}}, "mean": {summary metric: value}}.

    A cell row is {"group", "value", "task", "n", "status", *CELL_METRICS}; ``logits[t]`` is (N,)
    for a binary task, (N, K) for a K-class one (as ``compute_metrics``). ``smece`` inside a group
    is smECE at the task's bandwidth σ* on the whole split (``bandwidths``, from ``compute_metrics``;
    computed here when not given): one smoothing scale for every group of a task, so that groups
    are compared at the same resolution, and the group holding everyone gives the task's smECE.
    Sorting: every task's samples are sorted by confidence once; a group keeps that order.
    """
    check_groups(groups, task_names)
    rows = _per_sample(logits, labels)
    finite = np.array([np.isfinite(z).all() for z in logits])
    # Calibration needs each group's samples sorted by confidence: sort every task once, and let a
    # group keep that order. Means (accuracy, NLL, Brier) need no order: one matrix product per group task.
    order = np.argsort(rows["confidence"], axis=1)  # ties in any order: only sums over runs of values are used
    conf_sorted = np.take_along_axis(rows["confidence"], order, 1)
    outcome_sorted = np.take_along_axis(rows["outcome"], order, 1)
    if bandwidths is None:
        sigma = smooth_ece_sorted(SortedRows(conf_sorted, outcome_sorted))[1]
    else:
        sigma = np.array([bandwidths[name] for name in task_names])
    sigma = np.where(np.isfinite(sigma), sigma, 1.0)  # a task with non-finite logits: NaN metrics below anyway
    label_matrix = np.stack([np.asarray(y) for y in labels])
    binary = np.array([np.ndim(z) == 1 for z in logits])
    # per task: correct, NLL, Brier, outcome (one class only <=> no or all outcomes positive, for a binary task)
    per_sample = (rows["correct"], rows["nll"], rows["brier"], rows["outcome"])
    cells: list[dict] = []
    for group in groups:
        g = task_names.index(group)
        scored = np.array([t for t in range(len(task_names)) if t != g])
        masks = np.stack([label_matrix[g] == value for value in range(_num_values(logits[g]))], axis=1)  # (N, V)
        counts = masks.sum(0)
        weights = masks.astype(np.float64)
        sums = [values @ weights for values in per_sample]  # per task and value: sums inside the group
        group_sorted = label_matrix[g][order]  # (T, N): the group task's label in each task's sorted order
        for value in range(masks.shape[1]):
            n = int(counts[value])
            base = [{"group": group, "value": value, "task": task_names[t], "n": n} for t in scored]
            if n == 0:
                cells.extend({**row, "status": NO_SAMPLES} for row in base)
                continue
            inside = group_sorted == value  # (T, N): the group's samples in each task's sorted order
            sorted_rows = SortedRows(conf_sorted[inside].reshape(-1, n), outcome_sorted[inside].reshape(-1, n))
            values = {"accuracy": sums[0][:, value] / n, "nll": sums[1][:, value] / n, "brier": sums[2][:, value] / n,
                      ECE: errors_from_sums(sorted_rows.uniform_sums(SUMMARY_BINS))["ece"],
                      "smece": smooth_ece_at(sorted_rows, sigma)}
            positives = sums[3][:, value]
            for row, t in zip(base, scored):
                row.update({m: float(values[m][t]) if finite[t] else float("nan") for m in CELL_METRICS})
                if binary[t]:
                    one_class = positives[t] in (0, n)
                else:
                    one_class = len(np.unique(label_matrix[t][masks[:, value]])) < 2
                row["status"] = ONE_CLASS if one_class else OK
            cells.extend(base)
    per_task = {name: _summary(name, cells, groups) for name in task_names}
    per_task = {name: values for name, values in per_task.items() if values}
    mean = {m: float(np.mean([v[m] for v in per_task.values() if m in v]))
            for m in SUMMARY_METRICS if any(m in v for v in per_task.values())}
    return {"cells": cells, "tasks": per_task, "mean": mean}


def _summary(task: str, cells: list[dict], groups: list[str]) -> dict[str, float]:
    """One task's worst-group values, largest gaps and multicalibration error over its scored groups."""
    scored = [c for c in cells if c["task"] == task and c["status"] != NO_SAMPLES]
    if not scored:
        return {}
    out = {f"worst_group_{ECE}": max(c[ECE] for c in scored),
           "worst_group_accuracy": min(c["accuracy"] for c in scored),
           "multicalibration_smece": max(c["smece"] for c in scored)}
    for metric, name in ((ECE, f"group_gap_{ECE}"), ("accuracy", "group_gap_accuracy")):
        gaps = []
        for group in groups:
            values = [c[metric] for c in scored if c["group"] == group]
            if len(values) >= 2:  # a gap needs two non-empty groups of one group task
                gaps.append(max(values) - min(values))
        if gaps:
            out[name] = max(gaps)
    return out


def cells_frame(report: dict):
    """``group_metrics.csv``: one row per (group task, value, scored task); empty metric cells where no samples."""
    import pandas as pd

    columns = ["group", "value", "task", "n", "status", *CELL_METRICS]
    return pd.DataFrame(report["cells"], columns=columns)


def add_group_summary(metrics: dict, report: dict) -> dict:
    """Put each task's worst-group / gap / multicalibration values beside its metrics (and their means beside
    the task means), so ``test_metrics.csv``, W&B and ``compare`` carry them like any other metric."""
    for task, values in report["tasks"].items():
        metrics["tasks"][task].update(values)
    metrics["mean"].update(report["mean"])
    return metrics


def score_with_groups(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray], bins,
                      pairs: int, groups: list[str] | tuple[str, ...] = (), selective: bool = True) -> dict:
    """``compute_metrics`` and, with ``groups``, the subgroup metrics: their per-task summaries beside the
    metrics and the whole report under ``"groups"`` (the groups reuse each task's smECE bandwidth)."""
    bandwidths: dict[str, float] = {}
    metrics = compute_metrics(task_names, logits, labels, bins, pairs, selective=selective, bandwidths=bandwidths)
    if groups:
        report = group_metrics(task_names, logits, labels, list(groups), bandwidths)
        add_group_summary(metrics, report)
        metrics["groups"] = report
    return metrics
