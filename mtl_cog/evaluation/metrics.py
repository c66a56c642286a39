"""Per-task and task-averaged metrics: accuracy, NLL, Brier and binned calibration errors.

Conventions (docs/metrics.md), identical to probmetrics (Berta et al., 2025) and torchmetrics'
binary/multiclass ``CalibrationError``: a binary task (one logit z) is scored with the
positive-class probability p = sigmoid(z) against y; a K-class task with the top-label confidence
against correctness. Brier sums over classes (2 * (p - y)^2 for a binary task), NLL is in nats.
Before binning, probabilities are clamped to [1e-7, 1 - 1e-7], so a confidence of exactly 1.0
never falls into an extra bin. Bins are uniform on [0, 1]; ECE / RMSCE / MCE are the L1, L2 and
max norms of the per-bin gap |mean(y) - mean(p)|. Multi-task figures are unweighted means.

Why not call probmetrics per task: it drops classes absent from a split before calling
torchmetrics, which then fails on a binary task with one class present (frequent for rare CelebA
attributes on small splits), and a per-task loop over 40 attributes x 5 bin counts is slow. This
module computes every binary task at once with tensor ops; ``tests/test_metrics.py`` checks it
against probmetrics on ordinary data.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

BASE_METRICS = ("accuracy", "nll", "brier")
NORMS = ("ece", "rmsce", "mce")
CLAMP = 1e-7


def metric_names(bins: list[int] | tuple[int, ...]) -> list[str]:
    """Our metric names, e.g. accuracy, nll, brier, ece@15, rmsce@15, mce@15."""
    return list(BASE_METRICS) + [f"{norm}@{b}" for norm in NORMS for b in bins]


def lower_is_better(metric: str) -> bool:
    return metric.split("@")[0] != "accuracy"


def binned_calibration_errors(confidence: torch.Tensor, hit: torch.Tensor, n_bins: int) -> dict[str, torch.Tensor]:
    """ECE / RMSCE / MCE of each column: confidence and hit (0/1 outcome) are (N, T) -> (T,) each.

    One scatter-add over (task, bin) pairs bins every task at once.
    """
    n, tasks = confidence.shape
    conf = confidence.clamp(CLAMP, 1 - CLAMP)
    bin_index = (conf * n_bins).long().clamp_(max=n_bins - 1)  # uniform bins, right-open except the last
    flat = (bin_index + torch.arange(tasks, device=conf.device) * n_bins).reshape(-1)
    size = tasks * n_bins

    def per_bin(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(size, dtype=values.dtype, device=values.device).scatter_add_(0, flat, values.reshape(-1))

    count = per_bin(torch.ones_like(conf)).view(tasks, n_bins)
    gap = (per_bin(hit.to(conf.dtype)) - per_bin(conf)).view(tasks, n_bins).abs() / count.clamp(min=1)
    weight = count / n
    return {
        "ece": (gap * weight).sum(1),
        "rmsce": (gap.pow(2) * weight).sum(1).sqrt(),
        "mce": gap.amax(1),
    }


def _binary_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(N, T) logits and 0/1 labels -> base metrics (T,) each, and the calibration inputs."""
    y = labels.to(logits.dtype)
    p = torch.sigmoid(logits)
    base = {
        "accuracy": ((logits > 0).to(logits.dtype) == y).to(logits.dtype).mean(0),
        "nll": F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(0),
        "brier": (2 * (p - y).pow(2)).mean(0),
    }
    return base, p


def _multiclass_scores(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    log_p = F.log_softmax(logits, dim=1)
    p = log_p.exp()
    onehot = F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    confidence, predicted = p.max(dim=1)
    hit = (predicted == labels).to(logits.dtype)
    base = {
        "accuracy": hit.mean().reshape(1),
        "nll": F.nll_loss(log_p, labels).reshape(1),
        "brier": (p - onehot).pow(2).sum(1).mean().reshape(1),
    }
    return base, confidence[:, None], hit[:, None]


def _collect(
    base: dict[str, torch.Tensor], confidence: torch.Tensor, hit: torch.Tensor, bins: list[int] | tuple[int, ...]
) -> dict[str, torch.Tensor]:
    out = dict(base)
    for b in bins:
        for norm, values in binned_calibration_errors(confidence, hit, b).items():
            out[f"{norm}@{b}"] = values
    return out


def compute_metrics(
    task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray], bins: list[int] | tuple[int, ...]
) -> dict[str, dict]:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}} (unweighted mean over tasks).

    ``logits[t]`` is (N,) for a binary task and (N, K) for a K-class task; ``labels[t]`` is (N,).
    Binary tasks are scored together in one pass; multi-class tasks one by one.
    """
    names = metric_names(bins)
    per_task: dict[str, dict[str, float]] = {}
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    if binary:
        z = torch.as_tensor(np.stack([logits[t] for t in binary], axis=1), dtype=torch.float64)
        y = torch.as_tensor(np.stack([labels[t] for t in binary], axis=1), dtype=torch.long)
        base, p = _binary_scores(z, y)
        values = _collect(base, p, y.to(torch.float64), bins)
        for column, t in enumerate(binary):
            per_task[task_names[t]] = {m: float(values[m][column]) for m in names}
    for t, z in enumerate(logits):
        if np.ndim(z) == 2:
            base, confidence, hit = _multiclass_scores(
                torch.as_tensor(z, dtype=torch.float64), torch.as_tensor(labels[t], dtype=torch.long)
            )
            values = _collect(base, confidence, hit, bins)
            per_task[task_names[t]] = {m: float(values[m][0]) for m in names}
    per_task = {name: per_task[name] for name in task_names}  # data-set order
    mean = {m: float(np.mean([per_task[t][m] for t in task_names])) for m in names}
    return {"tasks": per_task, "mean": mean}


def task_metrics(logits: np.ndarray, labels: np.ndarray, bins: list[int] | tuple[int, ...]) -> dict[str, float]:
    """All metrics of one task: logits (N,) binary or (N, K) multi-class, labels (N,) ints."""
    return compute_metrics(["task"], [logits], [labels], bins)["tasks"]["task"]


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
