"""Calibration inside subgroups, and multicalibration: is every group calibrated, not only everyone on average?

``eval.groups: [Male, Young]`` names tasks of a multi-task data set whose labels define groups: a
group is one value of one group task ("Male=0", "Male=1", ...). Inside every group, every *other*
task is scored (a task used as a group is not scored against itself: inside "Male=1" its labels
are constant) with the cell metrics ``CELL_METRICS``, computed exactly as the overall ones
(mtl_cog.evaluation.metrics; one group holding everyone gives the overall values). Per task:

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

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.binning import CLAMP, binned_calibration_errors
from mtl_cog.evaluation.metrics import task_metrics
from mtl_cog.evaluation.smooth_ece import smooth_ece

ECE = f"ece@{SUMMARY_BINS}"
CELL_METRICS = ("accuracy", "nll", "brier", ECE, "smece")
SUMMARY_METRICS = (f"worst_group_{ECE}", f"group_gap_{ECE}", "worst_group_accuracy", "group_gap_accuracy",
                   "multicalibration_smece")
HIGHER_IS_BETTER = {"worst_group_accuracy"}
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


def _binary_cells(z: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Cell metrics of binary rows (C, n) at once, with the conventions of metrics._score_binary."""
    p = 1 / (1 + np.exp(-z))
    clamped = np.clip(p, CLAMP, 1 - CLAMP)
    out = {
        "accuracy": ((z > 0) == (y > 0.5)).mean(1),
        "nll": (np.logaddexp(0, z) - y * z).mean(1),
        "brier": 2 * ((p - y) ** 2).mean(1),
        ECE: binned_calibration_errors(clamped.T, y.T, SUMMARY_BINS)["ece"],
    }
    out["smece"], _ = smooth_ece(clamped, y)
    return out


def _num_values(logits: np.ndarray) -> int:
    return 2 if np.ndim(logits) == 1 else logits.shape[1]


def group_metrics(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray],
                  groups: list[str]) -> dict:
    """{"cells": [row, ...], "tasks": {task: {summary metric: value}}, "mean": {summary metric: value}}.

    A cell row is {"group", "value", "task", "n", "status", *CELL_METRICS}; ``logits[t]`` is (N,)
    for a binary task, (N, K) for a K-class one (as ``compute_metrics``).
    """
    check_groups(groups, task_names)
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    z_all = np.stack([np.asarray(logits[t], dtype=np.float64) for t in binary]) if binary else None
    y_all = np.stack([np.asarray(labels[t], dtype=np.float64) for t in binary]) if binary else None
    cells: list[dict] = []
    for group in groups:
        g = task_names.index(group)
        scored = [t for t in range(len(task_names)) if t != g]
        for value in range(_num_values(logits[g])):
            mask = np.asarray(labels[g]) == value
            n = int(mask.sum())
            rows = {t: {"group": group, "value": value, "task": task_names[t], "n": n} for t in scored}
            if n == 0:
                for row in rows.values():
                    row["status"] = NO_SAMPLES
                cells.extend(rows.values())
                continue
            rows_binary = [t for t in binary if t != g]
            if rows_binary:
                index = [binary.index(t) for t in rows_binary]
                values = _binary_cells(z_all[index][:, mask], y_all[index][:, mask])
                for i, t in enumerate(rows_binary):
                    rows[t].update({m: float(values[m][i]) for m in CELL_METRICS})
            for t in scored:
                if np.ndim(logits[t]) == 2:
                    all_metrics = task_metrics(np.asarray(logits[t])[mask], np.asarray(labels[t])[mask],
                                               [SUMMARY_BINS])
                    rows[t].update({m: all_metrics[m] for m in CELL_METRICS})
                rows[t]["status"] = ONE_CLASS if len(np.unique(np.asarray(labels[t])[mask])) < 2 else OK
            cells.extend(rows[t] for t in scored)
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
