"""Selective prediction: the risk–coverage curve, AURC and E-AURC (Geifman, Uziel & El-Yaniv, ICLR 2019).

A model that may abstain answers only its k most confident samples. With the N test samples
ordered by decreasing confidence, risk(k) is the error rate among the first k, and

    AURC   = (1/N) Σ_{k=1..N} risk(k)                        (area under the risk–coverage curve)
    AURC*  = AURC of the ideal ordering (every error after every correct answer)
           = (1/N) Σ_{k=N−E+1..N} (k − (N − E)) / k = (1/N) [E − (N − E)(H_N − H_{N−E})]
    E-AURC = AURC − AURC*                                    (>= 0; 0 = errors ranked last)

with E the number of errors and H_n the n-th harmonic number. Confidence is the top-label
probability: max(p, 1 − p) for a binary task (p = sigmoid(z), so the order is that of |z|), the
largest softmax probability for a K-class task; an error is a wrong top-label prediction (a
binary task predicts 1 when z > 0, as ``accuracy`` does).

Ties: samples of equal confidence cannot be ordered by it, so within a run of equal confidences
the cumulative error count is spread evenly (the expected count under a random order of the
run). AURC is then independent of the order in which tied samples arrive; without ties this is
Geifman et al.'s definition exactly. ``tests/test_selective.py`` checks a hand-worked example,
an independent implementation (to 1e-12), the ideal ordering and ties.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, softmax

from mtl_cog.evaluation.binning import running_sum, sort_with_binary_outcomes

SELECTIVE_METRICS = ("aurc", "eaurc")


def _harmonic(n: np.ndarray) -> np.ndarray:
    """H_n = ψ(n + 1) + γ (exact to ~1e-16 relative; H_0 = 0)."""
    return digamma(np.asarray(n, dtype=np.float64) + 1) + np.euler_gamma


def ideal_aurc(errors: np.ndarray, n: int) -> np.ndarray:
    """AURC of the ideal ordering with ``errors`` (E) wrong answers among ``n``: (1/N)[E − (N − E)(H_N − H_{N−E})]."""
    errors = np.asarray(errors, dtype=np.float64)
    correct = n - errors
    return (errors - correct * (_harmonic(n) - _harmonic(correct))) / n


def cumulative_errors(confidence: np.ndarray, error: np.ndarray) -> np.ndarray:
    """(C, N) rows -> (C, N + 1): errors among the k most confident samples, k = 0..N (ties spread evenly).

    One sort per row (``sort_with_binary_outcomes``: errors and correct answers sorted apart, then
    merged), read backwards for decreasing confidence.
    """
    ascending, outcomes = sort_with_binary_outcomes(confidence, np.asarray(error, dtype=np.float64))
    return cumulative_errors_sorted(ascending[:, ::-1], outcomes[:, ::-1])


def cumulative_errors_sorted(conf: np.ndarray, errors: np.ndarray) -> np.ndarray:
    """``cumulative_errors`` of rows already in order of decreasing confidence."""
    cum = running_sum(errors)
    row, pos = np.nonzero(conf[:, 1:] == conf[:, :-1])  # sample pos + 1 ties with sample pos (row-major)
    if len(row):
        # maximal runs of equal confidences, as samples start .. end − 1 of a row; only they change
        new = np.ones(len(pos), bool)
        new[1:] = (row[1:] != row[:-1]) | (pos[1:] != pos[:-1] + 1)
        last = np.append(new[1:], True)
        run_row, start, end = row[new], pos[new], pos[last] + 2
        length = end - start
        at = np.repeat(run_row, length)
        s, e = np.repeat(start, length), np.repeat(end, length)
        k = s + 1 + np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)  # s + 1 .. e
        before, after = cum[at, s], cum[at, e]
        cum[at, k] = before + (k - s) * (after - before) / (e - s)
    return cum


def risk_coverage(confidence: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One task's curve: confidence and 0/1 error (N,) -> coverage k/N and risk(k), k = 1..N."""
    cum = cumulative_errors(np.asarray(confidence, dtype=np.float64)[None], np.asarray(error)[None])[0]
    k = np.arange(1, len(cum))
    return k / len(k), cum[1:] / k


def aurc_rows(confidence: np.ndarray, error: np.ndarray) -> dict[str, np.ndarray]:
    """AURC and E-AURC of each row: confidence and 0/1 error (C, N) -> {"aurc": (C,), "eaurc": (C,)}."""
    confidence = np.asarray(confidence)
    confidence = confidence if confidence.dtype in (np.float32, np.float64) else confidence.astype(np.float64)
    n = confidence.shape[1]
    cum = cumulative_errors(confidence, error)
    aurc = (cum[:, 1:] / np.arange(1, n + 1)).mean(1)
    return {"aurc": aurc, "eaurc": aurc - ideal_aurc(cum[:, -1], n)}


def aurc_from_sorted_logits(z_sorted: np.ndarray, y_sorted: np.ndarray, nonpositive: np.ndarray) -> dict:
    """AURC / E-AURC of binary rows already sorted by their logit (as ``compute_metrics`` sorts them).

    Ascending z, the first ``nonpositive[row]`` samples (z <= 0, predicted 0) come in order of
    decreasing |z| and the rest (predicted 1), read backwards, too: one linear merge of the two
    runs gives the order of decreasing confidence, with no second sort.
    """
    rows, n = z_sorted.shape
    conf = np.empty((rows, n), dtype=z_sorted.dtype)
    errors = np.empty((rows, n))
    for row in range(rows):
        k = nonpositive[row]
        keys = np.concatenate([z_sorted[row, :k], -z_sorted[row, k:][::-1]])  # −|z|: two ascending runs
        merged = np.argsort(keys, kind="stable")
        conf[row] = -keys[merged]
        errors[row] = np.concatenate([y_sorted[row, :k], 1 - y_sorted[row, k:][::-1]])[merged]
    cum = cumulative_errors_sorted(conf, errors)
    aurc = (cum[:, 1:] / np.arange(1, n + 1)).mean(1)
    return {"aurc": aurc, "eaurc": aurc - ideal_aurc(cum[:, -1], n)}


def binary_confidence_error(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Binary logits and 0/1 labels (C, N) -> the ordering key |z| (the order of max(p, 1 − p)) and the errors.

    |z| orders exactly as max(p, 1 − p) = sigmoid(|z|) but keeps apart logits whose sigmoid
    rounds to 1.0 in float64 (|z| > 37).
    """
    return np.abs(z), ((z > 0) != (y > 0.5)).astype(np.float64)


def task_confidence_error(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One task's ordering key and 0/1 errors: logits (N,) binary or (N, K), labels (N,)."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim == 1:
        return binary_confidence_error(logits, np.asarray(labels))
    probs = softmax(logits, axis=1)
    return probs.max(1), (probs.argmax(1) != np.asarray(labels)).astype(np.float64)
