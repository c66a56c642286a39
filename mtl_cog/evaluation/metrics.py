"""Per-task and task-averaged metrics: accuracy, NLL, Brier, binned, adaptive and smooth calibration errors.

Conventions (docs/metrics.md, which also gives every formula), identical to probmetrics (Berta
et al., 2025) and torchmetrics' binary/multiclass ``CalibrationError``: a binary task (one logit
z) is scored with the positive-class probability p = sigmoid(z) against y; a K-class task with
the top-label confidence against correctness. Brier sums over classes (2 * (p - y)^2 for a
binary task), NLL is in nats. Before binning, probabilities are clamped to [1e-7, 1 - 1e-7], so
a confidence of exactly 1.0 never falls into an extra bin. ``ece@B`` / ``rmsce@B`` / ``mce@B``
use B uniform bins on [0, 1] and are the L1, L2 and max norms of the per-bin gap
|mean(y) - mean(p)|, weighted by the bins' share of samples. Multi-task figures are unweighted
means over the tasks that have the metric.

Beyond binned ECE (each defined in docs/metrics.md):

- ``smece``: smooth ECE (Błasiok & Nakkiran, 2023), no bins (mtl_cog.evaluation.smooth_ece);
- ``adaece@B``: ECE with B equal-mass bins (edges at the order statistics of the confidences);
- ``classwise_ece@B`` (K-class tasks only): the mean over classes of the uniform-bin ECE of each
  class probability p_k against 1[y = k] (Kull et al., 2019);
- ``brier_reliability`` / ``brier_resolution`` / ``brier_uncertainty``: the exact CORP split of
  the Brier score, Brier = reliability − resolution + uncertainty
  (mtl_cog.evaluation.brier_decomposition).

``compute_metrics`` also returns the multi-task metrics (mtl_cog.evaluation.multitask_metrics)
under ``"multitask"`` when there are at least two tasks.

Why not call probmetrics per task: it drops classes absent from a split before calling
torchmetrics, which then fails on a binary task with one class present (frequent for rare CelebA
attributes on small splits), and a per-task loop over 40 attributes x 5 bin counts is slow. This
module computes every binary task at once with array ops; ``tests/test_metrics.py`` checks it
against probmetrics on ordinary data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mtl_cog.errors import PredictionFileError
from mtl_cog.evaluation import multitask_metrics as multitask
from mtl_cog.evaluation.binning import (  # noqa: F401  (binned_calibration_errors: part of this module's API)
    CLAMP,
    SortedRows,
    bin_sums,
    binned_calibration_errors,
    errors_from_sums,
    uniform_bin_index,
)
from mtl_cog.evaluation.brier_decomposition import decompose_events
from mtl_cog.evaluation.smooth_ece import smooth_ece

BASE_METRICS = ("accuracy", "nll", "brier")
NORMS = ("ece", "rmsce", "mce")
BRIER_PARTS = ("brier_reliability", "brier_resolution", "brier_uncertainty")
HIGHER_IS_BETTER = {"accuracy", "brier_resolution"}


def metric_names(bins: list[int] | tuple[int, ...], multiclass: bool = False) -> list[str]:
    """Per-task metric names: accuracy, nll, brier, ece@B, rmsce@B, mce@B, smece, adaece@B, brier parts.

    ``multiclass=True`` adds ``classwise_ece@B``, which only K-class tasks have.
    """
    names = list(BASE_METRICS) + [f"{norm}@{b}" for norm in NORMS for b in bins]
    names += ["smece", *(f"adaece@{b}" for b in bins), *BRIER_PARTS]
    if multiclass:
        names += [f"classwise_ece@{b}" for b in bins]
    return names


def lower_is_better(metric: str) -> bool:
    return metric.split("@")[0] not in HIGHER_IS_BETTER


# ---------------------------------------------------------------------------------------------
# One group of events scored together: every binary task at once, or one K-class task


@dataclass
class Events:
    """Calibration inputs of a group of rows (one row per task), as in the module docstring."""

    confidence: np.ndarray  # (C, N) clamped: positive-class probability, or top-label confidence
    hit: np.ndarray  # (C, N) 0/1: the label, or whether the top label is right
    finite: np.ndarray  # (C,) False where a logit was NaN or infinite: those rows' metrics are NaN


def calibration_scores(events: Events, bins: list[int] | tuple[int, ...],
                       order: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """ece/rmsce/mce@B, smece, adaece@B of each row -> (metrics, uniform bin sums per B for pooling).

    ``order`` (C, N): an argsort of each row of the confidences (or of any monotone function of
    them, such as the unclamped probabilities), when the caller has one.
    """
    conf = np.where(events.finite[:, None], events.confidence, 0.5)  # placeholder; those rows become NaN
    if not events.finite.all():
        order = None
    rows = SortedRows(conf, events.hit, order)
    out: dict[str, np.ndarray] = {}
    sums = {}
    for b in bins:
        sums[b] = rows.uniform_sums(b)
        for norm, values in errors_from_sums(sums[b]).items():
            out[f"{norm}@{b}"] = values
    out["smece"], _ = smooth_ece(conf, events.hit)
    for b in bins:
        out[f"adaece@{b}"] = errors_from_sums(rows.equal_mass_sums(b))["ece"]
    for values in out.values():
        values[~events.finite] = np.nan
    return out, sums


def _binary_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[dict[str, np.ndarray], Events, np.ndarray]:
    """(N, T) logits and 0/1 labels -> base metrics (T,) each, the calibration events, p (T, N)."""
    y = labels.to(logits.dtype)
    p = torch.sigmoid(logits)
    base = {
        "accuracy": ((logits > 0).to(logits.dtype) == y).to(logits.dtype).mean(0),
        "nll": F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(0),
        "brier": (2 * (p - y).pow(2)).mean(0),
    }
    p_rows = p.T.contiguous().numpy()
    finite = np.isfinite(p_rows).all(1)
    events = Events(np.clip(p_rows, CLAMP, 1 - CLAMP), y.T.contiguous().numpy(), finite)
    return {k: v.numpy() for k, v in base.items()}, events, p_rows


def _multiclass_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[dict[str, np.ndarray], Events, np.ndarray]:
    """One K-class task -> base metrics (1,) each, the top-label events, class probabilities (K, N)."""
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
    finite = np.array([bool(torch.isfinite(logits).all())])
    events = Events(confidence.clamp(CLAMP, 1 - CLAMP).numpy()[None], hit.numpy()[None], finite)
    return {k: v.numpy() for k, v in base.items()}, events, p.T.contiguous().numpy()


def _brier_parts(p_rows: np.ndarray, outcome_rows: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """CORP parts of each row, NaN for a row with a non-finite probability -> (3, C)."""
    finite = np.isfinite(p_rows).all(1)
    parts = np.full((3, len(p_rows)), np.nan)
    if finite.all():
        parts[:] = decompose_events(p_rows, outcome_rows, order)
    elif finite.any():
        parts[:, finite] = decompose_events(p_rows[finite], outcome_rows[finite])
    return parts


def _score_binary(z: torch.Tensor, y: torch.Tensor, bins) -> tuple[dict[str, np.ndarray], dict, np.ndarray]:
    base, events, p_rows = _binary_scores(z, y)
    order = np.argsort(p_rows, axis=1)  # one sort serves the equal-mass bins and the Brier decomposition
    values, sums = calibration_scores(events, bins, order)
    parts = 2 * _brier_parts(p_rows, events.hit, order)  # the two classes' decompositions are identical
    values.update(base)
    values.update(dict(zip(BRIER_PARTS, parts)))
    if not events.finite.all():  # NaN logits predict nothing: no accuracy either
        values["accuracy"][~events.finite] = np.nan
    return values, sums, p_rows


def _score_multiclass(z: torch.Tensor, y: torch.Tensor, bins) -> tuple[dict[str, np.ndarray], dict]:
    base, events, probs = _multiclass_scores(z, y)
    values, sums = calibration_scores(events, bins)
    onehot = np.zeros_like(probs)
    onehot[y.numpy(), np.arange(probs.shape[1])] = 1.0
    parts = _brier_parts(probs, onehot).sum(1, keepdims=True)  # summed over classes, like the Brier score
    values.update(base)
    values.update(dict(zip(BRIER_PARTS, parts)))
    finite = bool(events.finite[0])
    clamped = np.clip(probs, CLAMP, 1 - CLAMP) if finite else np.full_like(probs, 0.5)
    for b in bins:  # Kull et al. (2019): mean over classes of each class probability's ECE
        per_class = errors_from_sums(bin_sums(clamped, onehot, uniform_bin_index(clamped, b), b))["ece"]
        values[f"classwise_ece@{b}"] = np.array([per_class.mean() if finite else np.nan])
    if not finite:
        values["accuracy"][:] = np.nan
    return values, sums


def compute_metrics(
    task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray], bins: list[int] | tuple[int, ...],
    pairs: int = multitask.DEFAULT_PAIRS,
) -> dict:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}} (unweighted mean over tasks), plus
    ``"multitask": {metric: value}`` with at least two tasks and ``"pairs": [...]`` (the per-pair
    joint calibration, mtl_cog.evaluation.multitask_metrics) with at least two binary tasks.

    ``logits[t]`` is (N,) for a binary task and (N, K) for a K-class task; ``labels[t]`` is (N,).
    Binary tasks are scored together in one pass; multi-class tasks one by one. ``pairs`` is the
    number k of most correlated attribute pairs whose joint calibration is measured (0 = none).
    """
    if not task_names or len(labels[0]) == 0:
        raise PredictionFileError(f"nothing to score: {len(task_names)} task(s) with "
                                  f"{len(labels[0]) if task_names else 0} samples each.")
    per_task: dict[str, dict[str, float]] = {}
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    task_sums: dict[int, dict] = {}
    binary_probs = None
    if binary:
        z = torch.as_tensor(np.stack([logits[t] for t in binary], axis=1), dtype=torch.float64)
        y = torch.as_tensor(np.stack([labels[t] for t in binary], axis=1), dtype=torch.long)
        values, sums, binary_probs = _score_binary(z, y, bins)
        for row, t in enumerate(binary):
            per_task[task_names[t]] = {m: float(values[m][row]) for m in metric_names(bins)}
            task_sums[t] = {b: sums[b][row] for b in bins}
    for t, z in enumerate(logits):
        if np.ndim(z) == 2:
            values, sums = _score_multiclass(
                torch.as_tensor(z, dtype=torch.float64), torch.as_tensor(labels[t], dtype=torch.long), bins
            )
            per_task[task_names[t]] = {m: float(values[m][0]) for m in metric_names(bins, multiclass=True)}
            task_sums[t] = {b: sums[b][0] for b in bins}
    per_task = {name: per_task[name] for name in task_names}  # data-set order
    names = metric_names(bins, multiclass=len(binary) < len(task_names))
    mean = {m: float(np.mean([v[m] for v in per_task.values() if m in v])) for m in names}
    out: dict = {"tasks": per_task, "mean": mean}
    if len(task_names) >= 2:
        pooled = {b: np.sum([task_sums[t][b] for t in range(len(task_names))], axis=0) for b in bins}
        out["multitask"] = multitask.task_spread(per_task, pooled, bins)
        if len(binary) >= 2:
            y_rows = np.stack([labels[t] for t in binary]).astype(np.float64)
            joint = multitask.joint_metrics([task_names[t] for t in binary], binary_probs, y_rows, pairs)
            out["multitask"].update(joint.scalars)
            if joint.pairs:
                out["pairs"] = joint.pairs
    return out


def task_metrics(logits: np.ndarray, labels: np.ndarray, bins: list[int] | tuple[int, ...]) -> dict[str, float]:
    """All metrics of one task: logits (N,) binary or (N, K) multi-class, labels (N,) ints."""
    return compute_metrics(["task"], [logits], [labels], bins)["tasks"]["task"]


def metrics_frame(metrics: dict):
    """One row per task plus a final ``mean`` row (the layout of ``test_metrics.csv``).

    The data-set-level multi-task metrics (``metrics["multitask"]``) are columns of the ``mean``
    row (empty on the task rows), so that tables over runs carry them like the task means.
    """
    import pandas as pd

    rows = [{"task": task, **values} for task, values in metrics["tasks"].items()]
    rows.append({"task": "mean", **metrics["mean"], **metrics.get("multitask", {})})
    return pd.DataFrame(rows)


SUMMARY_COLUMNS = ("accuracy", "nll", "brier", "ece@15", "smece")


def format_table(metrics: dict, columns: tuple[str, ...] = SUMMARY_COLUMNS) -> str:
    """The console table: one row per task + mean, then one line of multi-task metrics (if any)."""
    frame = metrics_frame(metrics)
    columns = tuple(c for c in columns if c in frame.columns)
    table = frame[["task", *columns]].to_string(index=False, float_format=lambda v: f"{v:.4f}")
    summary = multitask.summary_line(metrics.get("multitask", {}))
    return f"{table}\n{summary}" if summary else table
