"""Calibration of a multi-task model as a whole, beyond the mean of per-task errors.

The paper notes that "there are no MTL-specific calibration error metrics"; these are ours
(formulas in docs/explanation/metrics.md). With T tasks, p_t the predicted probability of attribute t (the
positive-class probability of a binary task) and y_t its label:

- ``pooled_ece@B``: the ECE of all tasks' calibration pairs pooled into one set (each task
  contributes its N pairs; positive-class probability for binary tasks, top-label confidence
  for K-class tasks), on the same uniform bins as ``ece@B``. Unlike the task mean it lets errors
  of opposite sign in different tasks cancel inside a bin, as a user reading all attributes at
  once would see them.
- ``worst_task_ece@B`` and ``p90_task_ece@B``: the largest and the 90th percentile (numpy's
  linear interpolation) of the per-task ``ece@B``: a low mean can hide a few badly calibrated tasks.
- ``count_ece`` (binary tasks only): per sample, the expected number of positive attributes
  Ĉ = Σ_t p_t against the actual count C = Σ_t y_t; samples are grouped by Ĉ rounded to the
  nearest integer (bins [k − ½, k + ½)), and count_ece = Σ_k (n_k / N) |mean C − mean Ĉ|, in
  attributes. The per-bin means are the count reliability curve (``count_calibration``).
- ``pair_joint_ece`` (binary tasks only): for the k attribute pairs whose labels are most
  correlated (largest |Pearson correlation| on the scored split, so every method scored on the
  same split gets the same pairs), the model's joint probability P(a ∧ b) = p_a · p_b (the heads
  are conditionally independent given the image) is scored against the co-occurrence y_a · y_b
  with the equal-mass ECE at ``PAIR_BINS`` bins (joint probabilities crowd near 0, where uniform
  bins would put almost every sample in the first bin); ``pair_joint_ece`` is the mean over the
  pairs, and ``"pairs"`` lists each pair's error. Even heads that are each perfectly calibrated
  get this wrong when the labels are dependent given the image: it shows what independent heads
  cannot express.

Which are computed: with one task, none (each would repeat that task's own ECE); with two or
more tasks, ``pooled_ece@B``, ``worst_task_ece@B``, ``p90_task_ece@B``; with two or more binary
tasks also ``count_ece`` and, when k > 0 and some pair has labels that vary, ``pair_joint_ece``
(over the binary tasks; K-class tasks have no single "positive attribute" to count or pair).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.binning import CLAMP, SortedRows, errors_from_sums, sort_with_binary_outcomes

DEFAULT_PAIRS = 10  # k: attribute pairs whose joint calibration is measured (eval.joint_pairs)
PAIR_BINS = SUMMARY_BINS  # equal-mass bins of the joint error
SPREAD_PERCENTILE = 90
BINNED_FAMILIES = ("pooled_ece", "worst_task_ece", "p90_task_ece")  # named "<family>@<bins>"
SCALARS = ("count_ece", "pair_joint_ece")


def is_multitask_metric(name: str) -> bool:
    """Whether a metric (a column of test_metrics.csv) is data-set-level: one value, in the ``mean`` row only."""
    base = name.removeprefix("nf_").split("@")[0]
    return base in BINNED_FAMILIES or base in SCALARS


def task_spread(per_task: dict[str, dict[str, float]], pooled_sums: dict[int, np.ndarray],
                bins: list[int] | tuple[int, ...], prefix: str = "") -> dict[str, float]:
    """pooled / worst-task / 90th-percentile-task ECE at each bin count.

    ``pooled_sums[B]`` (B, 3) are the uniform bin sums of every task added together;
    ``per_task[t][f"{prefix}ece@{B}"]`` the tasks' own errors (``prefix="nf_"`` for the noise-free ones).
    """
    out = {}
    for b in bins:
        out[f"{prefix}pooled_ece@{b}"] = float(errors_from_sums(pooled_sums[b][None])["ece"][0])
    for b in bins:
        values = np.array([v[f"{prefix}ece@{b}"] for v in per_task.values()])
        out[f"{prefix}worst_task_ece@{b}"] = float(np.max(values))  # NaN when a task has none: refused, not hidden
        out[f"{prefix}p90_task_ece@{b}"] = float(np.percentile(values, SPREAD_PERCENTILE))
    return out


# ---------------------------------------------------------------------------------------------
# Count calibration


@dataclass
class CountCalibration:
    """Per integer bin k of the expected count: samples, mean expected and mean actual count; the error."""

    bins: np.ndarray  # k = 0 .. T
    samples: np.ndarray
    mean_expected: np.ndarray  # NaN for empty bins
    mean_actual: np.ndarray
    ece: float


def count_calibration(expected: np.ndarray, actual: np.ndarray, num_tasks: int) -> CountCalibration:
    """``expected`` Σ_t p_t and ``actual`` Σ_t y_t (or Σ_t p*_t) per sample (N,) -> curve and ``count_ece``."""
    index = np.clip(np.floor(expected + 0.5), 0, num_tasks).astype(np.int64)
    size = num_tasks + 1
    samples = np.bincount(index, minlength=size).astype(np.float64)
    sum_expected = np.bincount(index, expected, size)
    sum_actual = np.bincount(index, actual, size)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_expected, mean_actual = sum_expected / samples, sum_actual / samples
    ece = float(np.abs(sum_actual - sum_expected).sum() / len(expected))
    return CountCalibration(np.arange(size), samples, mean_expected, mean_actual, ece)


# ---------------------------------------------------------------------------------------------
# Pairwise joint calibration


def select_pairs(labels: np.ndarray, k: int) -> list[tuple[int, int, float]]:
    """The k pairs (i < j) of rows of ``labels`` (T, N) with the largest |Pearson correlation|.

    Pairs involving a label that never varies on this split have no correlation and are never
    chosen; ties keep the (i, j) order. Returns (i, j, correlation) triples.
    """
    if k <= 0:
        return []
    centred = torch.as_tensor(labels - labels.mean(1, keepdims=True))
    # torch, not numpy's BLAS: OpenBLAS threads slow down 100-fold on a busy machine
    covariance = (centred @ centred.T).numpy() / labels.shape[1]
    std = np.sqrt(np.diag(covariance))
    varies = std > 0
    i, j = np.triu_indices(len(labels), 1)
    keep = varies[i] & varies[j]
    i, j = i[keep], j[keep]
    if len(i) == 0:
        return []
    corr = covariance[i, j] / (std[i] * std[j])
    order = np.argsort(-np.abs(corr), kind="stable")[:k]
    return [(int(i[p]), int(j[p]), float(corr[p])) for p in order]


def pair_joint_errors(probs: np.ndarray, targets: np.ndarray, pairs: list[tuple[int, int, float]],
                      binary_targets: bool) -> np.ndarray:
    """Equal-mass ECE (``PAIR_BINS``) of p_a·p_b against target_a·target_b for each pair -> (len(pairs),).

    ``targets`` are the labels (``binary_targets``: the observed co-occurrence y_a·y_b) or, for the
    noise-free version, the true probabilities (where the labels are drawn independently given
    the input, P*(a ∧ b) = p*_a·p*_b).
    """
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    joint = np.clip(probs[a] * probs[b], CLAMP, 1 - CLAMP)
    outcome = targets[a] * targets[b]
    rows = SortedRows(*sort_with_binary_outcomes(joint, outcome)) if binary_targets else SortedRows.sort(joint, outcome)
    return errors_from_sums(rows.equal_mass_sums(PAIR_BINS))["ece"]


@dataclass
class JointMetrics:
    scalars: dict[str, float] = field(default_factory=dict)  # count_ece, pair_joint_ece
    pairs: list[dict] = field(default_factory=list)  # one record per pair


def joint_metrics(names: list[str], probs: np.ndarray, labels: np.ndarray, k: int) -> JointMetrics:
    """``count_ece`` and the pairwise joint calibration of binary tasks: probs, labels (T, N), T >= 2.

    Tasks with a non-finite probability make both errors NaN (refused rather than computed
    from the other tasks).
    """
    out = JointMetrics()
    finite = bool(np.isfinite(probs).all())
    counted = count_calibration(probs.sum(0), labels.sum(0), len(probs)) if finite else None
    out.scalars["count_ece"] = counted.ece if finite else float("nan")
    chosen = select_pairs(labels, k)
    if not chosen:
        return out
    errors = pair_joint_errors(probs, labels, chosen, binary_targets=True) if finite else np.full(len(chosen), np.nan)
    out.scalars["pair_joint_ece"] = float(errors.mean())
    for (i, j, corr), error in zip(chosen, errors):
        out.pairs.append({"a": names[i], "b": names[j], "correlation": corr,
                          "observed": float((labels[i] * labels[j]).mean()),
                          "predicted": float((probs[i] * probs[j]).mean()), "joint_ece": float(error)})
    return out


def noise_free_joint_metrics(probs: np.ndarray, true_probs: np.ndarray, labels: np.ndarray, k: int) -> dict[str, float]:
    """``nf_count_ece`` and ``nf_pair_joint_ece``: probabilities, true probabilities, labels (T, N), T >= 2.

    The pairs are chosen on the labels, exactly as for ``pair_joint_ece``, so both are over the same pairs.
    """
    if not np.isfinite(probs).all():
        return {"nf_count_ece": float("nan")}
    out = {"nf_count_ece": count_calibration(probs.sum(0), true_probs.sum(0), len(probs)).ece}
    chosen = select_pairs(labels, k)
    if chosen:
        out["nf_pair_joint_ece"] = float(pair_joint_errors(probs, true_probs, chosen, binary_targets=False).mean())
    return out


def summary_line(scalars: dict[str, float], bins: int = SUMMARY_BINS) -> str:
    """One console line of the multi-task metrics at the summary bin count ('' when there are none)."""
    shown = [(f"pooled_ece@{bins}", "pooled ECE"), (f"worst_task_ece@{bins}", "worst-task ECE"),
             (f"p90_task_ece@{bins}", "p90-task ECE"), ("count_ece", "count ECE"),
             ("pair_joint_ece", "pair joint ECE")]
    parts = [f"{label} {scalars[key]:.4f}" for key, label in shown if key in scalars]
    return f"multi-task: {', '.join(parts)}" if parts else ""
