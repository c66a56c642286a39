"""Calibration inside subgroups, and multicalibration: is every group calibrated, not only everyone on average?

``eval.groups: [Male, Young]`` names tasks of a multi-task data set whose labels define groups: a
group is one value of one group task ("Male=0", "Male=1", ...). Inside every group, every *other*
task is scored (a task used as a group is not scored against itself: inside "Male=1" its labels
are constant) with the cell metrics ``CELL_METRICS``, computed as the overall ones
(mtl_cog.evaluation.metrics; one group holding everyone gives the overall values). ``smece``
inside a group is the group's own smooth ECE: its kernel width σ* found on the group's rows, as
``relplot.smECE`` of those rows finds it (Błasiok & Nakkiran's definition, used per group by
Hansen et al.'s multicalibration code). Per task:

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
cell, never 0 or NaN). Partly labelled data: a cell holds the group's samples labelled in the
scored task (its ``n``), as ``compute_metrics`` scores a task on its labelled rows; a sample
unlabelled in a group task is in none of its groups.

Cost: the bin sums of all groups, and the grid deposits of every step of every group's own
smECE bisection, come from one ``np.bincount`` per statistic over the joint values of the group
tasks (mtl_cog.evaluation.group_bins), with no group sorted or copied.
"""

from __future__ import annotations

import difflib

import numpy as np
from scipy.special import expit, log_softmax

from mtl_cog.constants import MISSING_LABEL, SUMMARY_BINS
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.binning import CLAMP, errors_from_sums
from mtl_cog.evaluation.group_bins import Combined, GroupBins, batches, group_smooth_ece
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.smooth_ece import COARSE_GRID

ECE = f"ece@{SUMMARY_BINS}"
CELL_METRICS = ("accuracy", "nll", "brier", ECE, "smece")
MEANS = ("accuracy", "nll", "brier")  # sums inside a group until divided by its size
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


PER_SAMPLE = ("correct", "nll", "brier", "outcome", "confidence")


def _per_sample(logits: list[np.ndarray], labels: list[np.ndarray]) -> np.ndarray:
    """Per sample (5, T, N), in the order of ``PER_SAMPLE``: correctness, NLL and Brier terms, and the
    calibration event (outcome, confidence).

    The conventions of mtl_cog.evaluation.metrics: a binary task is calibrated on (p, y), a K-class
    task on (top-label confidence, correctness); confidences clamped to [1e-7, 1 − 1e-7]. Binary
    tasks are computed together (in place: fresh (T, N) arrays cost as much as the arithmetic);
    their NLL as metrics does it, softplus(z) − y z with softplus(z) = max(z, 0) − log max(p, 1 − p).
    """
    out = np.empty((len(PER_SAMPLE), len(logits), len(labels[0])))
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    if binary:
        rows = out if len(binary) == len(logits) else np.empty((len(PER_SAMPLE), len(binary), out.shape[2]))
        _binary_per_sample(np.stack([logits[t] for t in binary], dtype=np.float64),
                           np.stack([labels[t] for t in binary]) > 0, rows)
        if rows is not out:
            out[:, binary] = rows
    for t, z in enumerate(logits):
        if np.ndim(z) == 2:
            y = np.where(np.asarray(labels[t]) == MISSING_LABEL, 0, labels[t])  # unlabelled: left out later
            log_p = log_softmax(np.asarray(z, dtype=np.float64), axis=1)
            probs = np.exp(log_p)
            predicted = probs.argmax(1)
            correct, nll, brier, outcome, confidence = out[:, t]  # views, in the order of PER_SAMPLE
            confidence[...] = probs[np.arange(len(y)), predicted]
            correct[...] = outcome[...] = predicted == y
            nll[...] = -log_p[np.arange(len(y)), y]
            probs[np.arange(len(y)), y] -= 1
            brier[...] = (probs**2).sum(1)
    confidences = out[PER_SAMPLE.index("confidence")]
    np.clip(confidences, CLAMP, 1 - CLAMP, out=confidences)
    return out


def _binary_per_sample(z: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    """``_per_sample`` of binary tasks, logits z (float64, overwritten) and labels y (bool) (Tb, N), into out."""
    correct, nll, brier, outcome, p = out
    outcome[...] = y
    np.equal(z > 0, y, out=correct)
    expit(z, out=p)
    np.multiply(outcome, z, out=brier)  # y z, until the Brier term takes its place
    np.subtract(1, p, out=nll)
    np.maximum(nll, p, out=nll)
    np.log(nll, out=nll)  # log max(p, 1 − p)
    np.maximum(z, 0, out=z)
    np.subtract(z, nll, out=nll)
    nll -= brier  # max(z, 0) − log max(p, 1 − p) − y z
    np.subtract(p, outcome, out=brier)
    np.square(brier, out=brier)
    brier *= 2


def group_metrics(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray],
                  groups: list[str]) -> dict:
    """{"cells": [row, ...], "tasks": {task: {summary metric: value}}, "mean": {summary metric: value}}.

    A cell row is {"group", "value", "task", "n", "status", *CELL_METRICS}; ``logits[t]`` is (N,)
    for a binary task, (N, K) for a K-class one (as ``compute_metrics``). ``smece`` inside a group
    is the smooth ECE of the group's rows at their own bandwidth σ* (``relplot.smECE`` of those
    rows), so a group holding everyone gives the task's smECE. The bin sums of every group come
    from one bincount per statistic (mtl_cog.evaluation.group_bins).
    """
    check_groups(groups, task_names)
    every = _per_sample(logits, labels)
    rows = dict(zip(PER_SAMPLE, every))
    finite = np.array([np.isfinite(z).all() for z in logits])
    # partly labelled data: a sample unlabelled in a task counts in none of that task's cells
    known = np.stack([np.asarray(y) != MISSING_LABEL for y in labels])
    partly = not known.all()
    if partly:
        every[:4, ~known] = 0.0  # correct, NLL, Brier, outcome: out of every sum
    # ECE inside a group needs only sums over bins of confidence: each task's bins are found once, and
    # every group's sums come from one bincount per statistic. A task with non-finite logits gets
    # placeholders there (its metrics are NaN below).
    confidence, outcome = rows["confidence"], rows["outcome"]
    if not finite.all():
        confidence, outcome = np.where(finite[:, None], confidence, 0.5), np.where(finite[:, None], outcome, 0.0)
    cells_of = GroupBins(confidence, outcome, SUMMARY_BINS, known if partly else None)
    binary = np.array([np.ndim(z) == 1 for z in logits])
    # per task: correct, NLL, Brier, outcome (one class only <=> no or all outcomes positive, for a binary task)
    per_sample = every[:4].reshape(-1, every.shape[2])  # (4T, N)
    indices = [task_names.index(group) for group in groups]
    num_values = [_num_values(logits[g]) for g in indices]
    events = per_sample.size // 4
    # smECE's own runs of group tasks: its bincounts have T x COARSE_GRID cells per joint value (ECE@15's T x 15)
    smece: dict[int, np.ndarray] = {}  # group task i -> (values, T)
    for run in batches(num_values, events, len(task_names) * COARSE_GRID):
        combined = Combined([labels[indices[i]] for i in run], [num_values[i] for i in run])
        rows = group_smooth_ece(confidence, outcome, combined, known if partly else None)  # (R, T)
        for i, start in zip(run, np.cumsum([0] + [num_values[i] for i in run])):
            smece[i] = rows[start:start + num_values[i]]
    cells: list[dict] = []
    for run in batches(num_values, events, cells_of.cells_per_group()):
        combined = Combined([labels[indices[i]] for i in run], [num_values[i] for i in run])
        # samples per task and group: the group's labelled samples of the task
        counts = combined.sums_of(known.astype(np.float64)) if partly else np.tile(combined.counts(), (len(known), 1))
        sums = combined.sums_of(per_sample).reshape(4, len(task_names), -1)  # (4, T, R): sums inside each group
        bin_sums = cells_of.scores(combined)  # (R, T, B, 3)
        first = 0  # the run's groups are its rows: group task by group task, value by value
        for i in run:
            rows_of_i = range(first, first + num_values[i])
            per_value = [(counts[:, r], sums[:, :, r], bin_sums[r], smece[i][r - first]) for r in rows_of_i]
            cells.extend(_cells(groups[i], indices[i], task_names, labels, binary, finite, known, per_value))
            first += num_values[i]
    per_task = {name: _summary(name, cells, groups) for name in task_names}
    per_task = {name: values for name, values in per_task.items() if values}
    mean = {m: float(np.mean([v[m] for v in per_task.values() if m in v]))
            for m in SUMMARY_METRICS if any(m in v for v in per_task.values())}
    return {"cells": cells, "tasks": per_task, "mean": mean}


def _cells(group: str, g: int, task_names: list[str], labels: list[np.ndarray], binary: np.ndarray,
           finite: np.ndarray, known: np.ndarray, per_value: list[tuple]) -> list[dict]:
    """The cell rows of one group task: per value, (counts (T,), sums (4, T), bin sums (T, B, 3), smECE (T,))."""
    cells: list[dict] = []
    for value, (counts, sums, bin_sums, smece) in enumerate(per_value):
        ece = np.full(len(counts), np.nan)
        ece[counts > 0] = errors_from_sums(bin_sums[counts > 0])["ece"]
        metrics = {"accuracy": sums[0], "nll": sums[1], "brier": sums[2], ECE: ece, "smece": smece}
        inside = np.asarray(labels[g]) == value
        for t, name in enumerate(task_names):
            if t == g:
                continue
            n = int(counts[t])
            row = {"group": group, "value": value, "task": name, "n": n}
            cells.append(row)
            if n == 0:
                row["status"] = NO_SAMPLES
                continue
            row.update({m: float(metrics[m][t] / (n if m in MEANS else 1)) if finite[t] else float("nan")
                        for m in CELL_METRICS})
            if binary[t]:
                one_class = sums[3][t] in (0, n)
            else:
                one_class = len(np.unique(np.asarray(labels[t])[inside & known[t]])) < 2
            row["status"] = ONE_CLASS if one_class else OK
    return cells


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
    metrics and the whole report under ``"groups"``."""
    metrics = compute_metrics(task_names, logits, labels, bins, pairs, selective=selective)
    if groups:
        report = group_metrics(task_names, logits, labels, list(groups))
        add_group_summary(metrics, report)
        metrics["groups"] = report
    return metrics
