"""Per-task and task-averaged metrics, computed with probmetrics (Berta et al., 2025).

Conventions (DESIGN.md §5): a binary task (one logit z) is scored with the positive-class
probability sigmoid(z) against y; a K-class task with top-label confidence against correctness.
probmetrics gets binary tasks as two logit columns [0, z], which gives exactly that. Brier sums
over classes (2 * (p - y)^2 for a binary task), NLL is in nats, and probabilities are clamped to
[1e-7, 1 - 1e-7] before binning, so a confidence of exactly 1.0 never falls into an extra bin.
Multi-task figures are the unweighted mean over tasks.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

BASE_METRICS = ("accuracy", "nll", "brier")
CALIBRATION_NORMS = {"ece": "ece", "rmsce": "rmsce", "mce": "mce"}  # ours -> probmetrics prefix
LOWER_IS_BETTER = {"accuracy": False}


def metric_names(bins: list[int] | tuple[int, ...]) -> list[str]:
    """Our metric names, e.g. accuracy, nll, brier, ece@15, rmsce@15, mce@15."""
    return list(BASE_METRICS) + [f"{norm}@{b}" for norm in CALIBRATION_NORMS for b in bins]


def lower_is_better(metric: str) -> bool:
    return LOWER_IS_BETTER.get(metric.split("@")[0], True)


@lru_cache(maxsize=8)
def _probmetrics(bins: tuple[int, ...]):
    from probmetrics.metrics import Metrics  # imported lazily: building its catalogue takes seconds

    names = ["accuracy", "logloss", "brier"] + [f"{norm}-{b}" for norm in CALIBRATION_NORMS.values() for b in bins]
    return Metrics.from_names(names)


def _to_ours(name: str) -> str:
    if name == "logloss":
        return "nll"
    if "-" in name:
        norm, b = name.split("-")
        return f"{norm}@{b}"
    return name


def as_two_class_logits(logits: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(N,) binary logits -> (N, 2) [0, z]; (N, K) multi-class logits pass through."""
    z = torch.as_tensor(np.asarray(logits), dtype=torch.float32)
    return torch.stack([torch.zeros_like(z), z], dim=1) if z.ndim == 1 else z


def task_metrics(logits: np.ndarray, labels: np.ndarray, bins: list[int] | tuple[int, ...]) -> dict[str, float]:
    """All metrics of one task: logits (N,) binary or (N, K) multi-class, labels (N,) ints."""
    metrics = _probmetrics(tuple(bins))
    values = metrics.compute_all_from_labels_logits(
        torch.as_tensor(np.asarray(labels), dtype=torch.long), as_two_class_logits(logits)
    )
    out = {_to_ours(k): float(v) for k, v in values.items()}
    return {name: out[name] for name in metric_names(bins)}


def compute_metrics(
    task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray], bins: list[int] | tuple[int, ...]
) -> dict[str, dict]:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}} (unweighted mean over tasks)."""
    per_task = {name: task_metrics(z, y, bins) for name, z, y in zip(task_names, logits, labels, strict=True)}
    mean = {m: float(np.mean([per_task[t][m] for t in task_names])) for m in metric_names(bins)}
    return {"tasks": per_task, "mean": mean}


def metrics_frame(metrics: dict[str, dict]):
    """One row per task plus a final ``mean`` row (the layout of ``test_metrics.csv``)."""
    import pandas as pd

    rows = [{"task": task, **values} for task, values in metrics["tasks"].items()]
    rows.append({"task": "mean", **metrics["mean"]})
    return pd.DataFrame(rows)


def format_table(metrics: dict[str, dict], columns: tuple[str, ...] = ("accuracy", "nll", "brier", "ece@15")) -> str:
    frame = metrics_frame(metrics)
    columns = tuple(c for c in columns if c in frame.columns)
    return frame[["task", *columns]].to_string(index=False, float_format=lambda v: f"{v:.4f}")
