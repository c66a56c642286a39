"""Scores against the true probabilities p*, for data sets that know them (``synthetic``).

Label-based calibration errors (ECE & co., mtl_cog/evaluation/metrics.py) compare each bin's mean predicted
probability with the mean of noisy 0/1 labels, so on a finite test set they mix miscalibration
with sampling noise of the labels, and binning hides errors that cancel within a bin. When the
data set knows p*(x) = P(y | x), three cleaner quantities exist; no public calibration library
computes them, so they are written here by hand:

- **noise-free calibration error** ``nf_ece@B`` / ``nf_rmsce@B`` / ``nf_mce@B``: the *same* bins
  of p̂ as ``ece@B`` (uniform on [0, 1], p̂ clamped to [1e-7, 1 - 1e-7] first), but each bin's
  mean p̂ is compared with the bin's mean **p*** instead of the mean label; L1 / L2 / max norms
  over bins weighted by their share of samples, exactly like ece / rmsce / mce. It is what ECE
  estimates, without the label noise.
- **noise-free smooth ECE** ``nf_smece``: smooth ECE (mtl_cog.evaluation.smooth_ece) with the
  residual p̂ − p* in place of p̂ − y; the same bandwidth rule.
- **probability error** ``prob_error``: mean |p̂ − p*| over samples (for K classes the total
  variation ½ Σ_k |p̂_k − p*_k|, which equals |p̂ − p*| for a binary task). Calibration plus
  everything binning averages away: a model can have zero calibration error and a large
  probability error (e.g. predicting the base rate everywhere).
- **KL and excess Brier** ``kl_true`` = mean KL(p* ‖ p̂) and ``excess_brier`` = mean Σ_k (p̂_k − p*_k)²:
  by exact identities, the model's NLL and Brier *in expectation over the labels* minus the
  Bayes floors below (how far the model is from the best possible scores, noise removed).
- **Bayes floors**: the scores of the Bayes predictor p* itself, in two readings:
  ``bayes_accuracy``, ``bayes_nll``, ``bayes_brier`` are p* scored against **this test set's
  labels** (directly comparable with the model's label-based accuracy / NLL / Brier on the same
  sample, same label noise), and ``bayes_accuracy_exp``, ``bayes_nll_exp``, ``bayes_brier_exp``
  are their **expectations over the labels** y ~ p*(x) on the same inputs (E max_k p*_k,
  the entropy H(p*), Σ_k p*_k (1 − p*_k)): the floors without label sampling noise.

For two or more tasks, ``truth_metrics`` also returns the noise-free versions of the multi-task
metrics (mtl_cog.evaluation.multitask_metrics) under ``"multitask"``: ``nf_pooled_ece@B``,
``nf_worst_task_ece@B``, ``nf_p90_task_ece@B`` (from the noise-free bins above), and with two or
more binary tasks ``nf_count_ece`` (the expected count Σ p̂_t against the true expected count
Σ p*_t) and ``nf_pair_joint_ece`` (p̂_a p̂_b against p*_a p*_b, on the same pairs as
``pair_joint_ece``). p*_a p*_b is the true joint probability where the labels are drawn
independently given the input, as in ``synthetic`` (each y_t ~ Bernoulli(p_t(u)) given the latent u).

Conventions follow mtl_cog/evaluation/metrics.py: a binary task has one logit z and p̂ = sigmoid(z), p* is
P(y = 1 | x) with shape (N,), calibration is of the positive-class probability; a K-class task
has (N, K) logits and (N, K) p*, calibration is of the top-label confidence, compared with p* of
the predicted class. Brier sums over classes (2 (p − y)² for a binary task); NLL in nats.
Multi-task figures are unweighted means over tasks.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, log_softmax, softmax

from mtl_cog.errors import TruthError
from mtl_cog.evaluation import multitask_metrics as multitask
from mtl_cog.evaluation.binning import CLAMP, bin_sums, errors_from_sums, uniform_bin_index
from mtl_cog.evaluation.metrics import NORMS
from mtl_cog.evaluation.predictions import Predictions, labelled_only
from mtl_cog.evaluation.smooth_ece import smooth_ece

FLOOR_METRICS = ("bayes_accuracy", "bayes_nll", "bayes_brier", "bayes_accuracy_exp", "bayes_nll_exp",
                 "bayes_brier_exp")
MODEL_METRICS = ("prob_error", "kl_true", "excess_brier")
_LOG_EPS = 1e-12  # p* may be exactly 0 or 1 in float32; 0 * log 0 is taken as 0


def truth_metric_names(bins: list[int] | tuple[int, ...]) -> list[str]:
    return [f"nf_{norm}@{b}" for norm in NORMS for b in bins] + ["nf_smece", *MODEL_METRICS, *FLOOR_METRICS]


def noise_free_bin_sums(confidence: np.ndarray, target: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin ``confidence`` uniformly (as ECE does) -> (n_bins, 3): count, sum of ``target``, sum of confidence.

    ``target`` is the true probability of the event whose predicted probability is ``confidence``
    (p* for a binary task, p* of the predicted class for top-label calibration): the same binning as
    the label-based errors (mtl_cog.evaluation.binning), with p* in place of the 0/1 outcome. A
    task's errors and the pooled multi-task errors are both read from these sums.
    """
    conf = np.clip(np.asarray(confidence, dtype=np.float64), CLAMP, 1 - CLAMP)[None]
    return bin_sums(conf, np.asarray(target, dtype=np.float64)[None], uniform_bin_index(conf, n_bins), n_bins)[0]


def _as_class_probs(logits: np.ndarray, true_probs: np.ndarray, task: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> p̂ (N, K), log p̂ (N, K), p* (N, K), with a binary task as K = 2 columns [1 − p, p]."""
    z = np.asarray(logits, dtype=np.float64)
    p_true = np.asarray(true_probs, dtype=np.float64)
    if z.ndim == 1:
        if p_true.shape != z.shape:
            raise TruthError(f"task {task!r}: binary logits have shape {z.shape} but true_probs {p_true.shape}.")
        p = expit(z)
        log_p = np.stack([-np.logaddexp(0, z), -np.logaddexp(0, -z)], axis=1)  # log(1 − p), log p, stably
        return np.stack([1 - p, p], axis=1), log_p, np.stack([1 - p_true, p_true], axis=1)
    if p_true.shape != z.shape:
        raise TruthError(f"task {task!r}: logits have shape {z.shape} but true_probs {p_true.shape}.")
    return softmax(z, axis=1), log_softmax(z, axis=1), p_true


def task_truth_metrics(logits: np.ndarray, true_probs: np.ndarray, labels: np.ndarray,
                       bins: list[int] | tuple[int, ...], task: str = "task") -> dict[str, float]:
    """Every truth metric of one task (names from ``truth_metric_names(bins)``)."""
    return _task_truth(logits, true_probs, labels, bins, task)[0]


def _task_truth(logits: np.ndarray, true_probs: np.ndarray, labels: np.ndarray, bins: list[int] | tuple[int, ...],
                task: str) -> tuple[dict[str, float], dict[int, np.ndarray]]:
    """-> (the task's truth metrics, its noise-free bin sums {B: (B, 3)})."""
    p, log_p, p_true = _as_class_probs(logits, true_probs, task)
    if np.any(p_true < -1e-6) or np.any(p_true > 1 + 1e-6) or not np.allclose(p_true.sum(1), 1, atol=1e-4):
        raise TruthError(f"task {task!r}: true_probs must be probabilities (in [0, 1], summing to 1 over classes).")
    labels = np.asarray(labels, dtype=np.int64)
    n, k = p.shape
    onehot = np.eye(k)[labels]
    binary = np.ndim(logits) == 1
    if binary:  # positive-class calibration, decision at p > 0.5 (the logit > 0 rule of metrics.py)
        confidence, target = p[:, 1], p_true[:, 1]
        bayes_pred = (p_true[:, 1] > 0.5).astype(np.int64)
    else:  # top-label calibration: the true probability of the class the model predicts
        predicted = p.argmax(1)
        confidence, target = p[np.arange(n), predicted], p_true[np.arange(n), predicted]
        bayes_pred = p_true.argmax(1)
    out: dict[str, float] = {}
    sums = {b: noise_free_bin_sums(confidence, target, b) for b in bins}
    for b in bins:
        for norm, value in errors_from_sums(sums[b][None]).items():
            out[f"nf_{norm}@{b}"] = float(value[0])
    out["nf_smece"] = float(smooth_ece(np.clip(confidence, CLAMP, 1 - CLAMP)[None], target[None])[0][0])
    log_true = np.log(np.clip(p_true, _LOG_EPS, 1.0))
    out["prob_error"] = float(0.5 * np.abs(p - p_true).sum(1).mean())
    out["kl_true"] = float((p_true * (log_true - log_p)).sum(1).mean())
    out["excess_brier"] = float(((p - p_true) ** 2).sum(1).mean())
    out["bayes_accuracy"] = float((bayes_pred == labels).mean())
    out["bayes_nll"] = float(-log_true[np.arange(n), labels].mean())
    out["bayes_brier"] = float(((p_true - onehot) ** 2).sum(1).mean())
    out["bayes_accuracy_exp"] = float(p_true.max(1).mean())
    out["bayes_nll_exp"] = float(-(p_true * log_true).sum(1).mean())
    out["bayes_brier_exp"] = float((p_true * (1 - p_true)).sum(1).mean())
    return out, sums


def labelled_truth_metrics(predictions: Predictions, bins: list[int] | tuple[int, ...]) -> dict[str, dict] | None:
    """``truth_metrics`` of ``predictions`` on the rows labelled in every task, or None without p* or with
    fewer than two such rows. Partly labelled data: the Bayes scores need each row's label and the
    noise-free joint metrics pair tasks up, so every truth metric uses the same aligned rows."""
    if predictions.true_probs is None:
        return None
    aligned = labelled_only(predictions, every_task=True)
    if len(aligned) < 2:
        return None
    return truth_metrics(aligned.task_names, aligned.logits, aligned.labels, aligned.true_probs, bins)


def truth_metrics(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray],
                  true_probs: list[np.ndarray], bins: list[int] | tuple[int, ...],
                  pairs: int = multitask.DEFAULT_PAIRS) -> dict[str, dict]:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}}, the layout of ``compute_metrics``,
    plus the noise-free multi-task metrics under "multitask" for two or more tasks (module docstring)."""
    results = [_task_truth(z, pt, y, bins, name) for name, z, y, pt in zip(task_names, logits, labels, true_probs)]
    per_task = {name: result[0] for name, result in zip(task_names, results)}
    names = truth_metric_names(bins)
    out: dict = {"tasks": per_task,
                 "mean": {m: float(np.mean([per_task[t][m] for t in task_names])) for m in names}}
    if len(task_names) < 2:
        return out
    pooled = {b: np.sum([sums[b] for _, sums in results], axis=0) for b in bins}  # every task's bins added
    out["multitask"] = multitask.task_spread(per_task, pooled, bins, prefix="nf_")
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    if len(binary) >= 2:
        probs = expit(np.stack([logits[t] for t in binary]).astype(np.float64))
        truth = np.stack([true_probs[t] for t in binary]).astype(np.float64)
        observed = np.stack([labels[t] for t in binary]).astype(np.float64)
        out["multitask"].update(multitask.noise_free_joint_metrics(probs, truth, observed, pairs))
    return out
