"""Binned calibration errors: the one definition of a bin, its gap and the three norms.

Every binned error of the project (``ece@B``, ``rmsce@B``, ``mce@B``, ``adaece@B``,
``classwise_ece@B``, the pooled and joint errors of mtl_cog.evaluation.multitask_metrics and the
noise-free errors of mtl_cog.evaluation.truth) comes from here: per bin, the count n_b, the sum
of outcomes H_b and the sum of confidences P_b; the gap is |H_b − P_b| / n_b, and

    ECE = Σ_b (n_b / N) gap_b,   RMSCE = sqrt(Σ_b (n_b / N) gap_b²),   MCE = max over non-empty bins of gap_b.

Confidences are clamped to [1e-7, 1 − 1e-7] before binning (``CLAMP``). Uniform bins on [0, 1]
are right-open except the last; equal-mass bins are defined in ``SortedRows.equal_mass_sums``.
Arrays are (C, N): one row per event (task, class or attribute pair), N samples.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, softmax

CLAMP = 1e-7



def bin_sums(confidence: np.ndarray, hit: np.ndarray, bin_index: np.ndarray, n_bins: int) -> np.ndarray:
    """Per row and bin: (count, sum of hits, sum of confidences); rows (C, N) -> (C, n_bins, 3).

    One ``bincount`` per statistic over (row, bin) pairs bins every row at once.
    """
    rows = len(confidence)
    flat = (bin_index + (np.arange(rows) * n_bins)[:, None]).ravel()
    size = rows * n_bins
    count = np.bincount(flat, minlength=size).astype(np.float64)
    hits = np.bincount(flat, hit.ravel(), size)
    confs = np.bincount(flat, confidence.ravel(), size)
    return np.stack([count, hits, confs], axis=1).reshape(rows, n_bins, 3)


def errors_from_sums(sums: np.ndarray) -> dict[str, np.ndarray]:
    """(C, B, 3) bin sums -> ECE / RMSCE / MCE of each row: L1, L2, max of |mean hit − mean confidence|."""
    count, hits, confs = sums[..., 0], sums[..., 1], sums[..., 2]
    gap = np.abs(hits - confs) / np.maximum(count, 1)
    weight = count / count.sum(1, keepdims=True)
    return {"ece": (gap * weight).sum(1), "rmsce": np.sqrt((gap**2 * weight).sum(1)), "mce": gap.max(1)}


def uniform_bin_index(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Uniform bins on [0, 1], right-open except the last; ``confidence`` already clamped."""
    index = (confidence * n_bins).astype(np.int64)
    return np.minimum(index, n_bins - 1, out=index)  # in place: one (C, N) array fewer


def reliability_bins(probability, outcome, n_bins: int, truth=None) -> dict:
    """What a reliability diagram draws, per uniform bin of ``ece@B``: count, mean confidence, observed frequency
    (and mean p* where ``truth`` is given; else NaN). Empty bins have count 0 and NaN means; ``ece`` is their ECE."""
    conf = np.clip(np.asarray(probability, dtype=np.float64), CLAMP, 1 - CLAMP)
    index = uniform_bin_index(conf, n_bins)
    sums = bin_sums(conf[None], np.asarray(outcome, dtype=np.float64)[None], index[None], n_bins)
    count, hits, confs = sums[0].T
    with np.errstate(invalid="ignore", divide="ignore"):  # empty bins: NaN, never drawn
        mean_truth = np.full(n_bins, np.nan) if truth is None else \
            np.bincount(index, np.asarray(truth, dtype=np.float64), n_bins) / count
        return {"count": count, "mean_confidence": confs / count, "frequency": hits / count, "mean_truth": mean_truth,
                "ece": float(errors_from_sums(sums)["ece"][0])}


def binned_calibration_errors(confidence, hit, n_bins: int) -> dict[str, np.ndarray]:
    """ECE / RMSCE / MCE of each column: confidence and hit (0/1 outcome) are (N, T) -> (T,) each."""
    conf = np.clip(np.asarray(confidence, dtype=np.float64), CLAMP, 1 - CLAMP).T
    outcome = np.asarray(hit, dtype=np.float64).T
    return errors_from_sums(bin_sums(conf, outcome, uniform_bin_index(conf, n_bins), n_bins))


def running_sum(rows: np.ndarray) -> np.ndarray:
    """(C, N) -> (C, N + 1): 0 then the cumulative sums of each row (a bin's sum is a difference of two)."""
    out = np.empty((rows.shape[0], rows.shape[1] + 1))
    out[:, 0] = 0.0
    np.cumsum(rows, axis=1, out=out[:, 1:])
    return out


def sort_with_binary_outcomes(values: np.ndarray, outcomes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row (C, N) of ``values`` sorted ascending, with its 0/1 ``outcomes`` in the same order.

    The same result as an argsort and two gathers, faster: per row, the values of the negatives
    and of the positives are sorted separately (a plain sort, several times faster than an
    argsort), then merged by a stable argsort, which finds the two sorted runs and merges them
    in one linear pass. Ties between a negative and a positive keep the negative first.
    """
    sorted_values = np.empty_like(values)
    sorted_outcomes = np.empty(values.shape)
    positive = outcomes > 0.5
    for row in range(len(values)):
        negatives = np.sort(values[row][~positive[row]])
        runs = np.concatenate([negatives, np.sort(values[row][positive[row]])])
        merged = np.argsort(runs, kind="stable")
        sorted_values[row] = runs[merged]
        sorted_outcomes[row] = merged >= len(negatives)
    return sorted_values, sorted_outcomes


class SortedRows:
    """Rows (C, N) sorted by confidence, with running sums: the sums over any bin of consecutive
    confidences are two look-ups, so every bin count and both binnings cost one sort in total."""

    def __init__(self, sorted_confidence: np.ndarray, sorted_hit: np.ndarray) -> None:
        self.confidence, self.hit = sorted_confidence, sorted_hit
        self.cum_hit = running_sum(sorted_hit)
        self.cum_conf = running_sum(sorted_confidence)

    @classmethod
    def sort(cls, confidence: np.ndarray, hit: np.ndarray) -> SortedRows:
        order = np.argsort(confidence, axis=1)
        return cls(np.take_along_axis(confidence, order, 1), np.take_along_axis(hit, order, 1))

    def sums(self, starts: np.ndarray) -> np.ndarray:
        """Bins given by where they start in each sorted row, (C, B + 1) with 0 and N at the ends -> (C, B, 3)."""
        count = np.diff(starts, axis=1).astype(np.float64)
        hits = np.diff(np.take_along_axis(self.cum_hit, starts, 1), axis=1)
        confs = np.diff(np.take_along_axis(self.cum_conf, starts, 1), axis=1)
        return np.stack([count, hits, confs], axis=2)

    def _starts(self, boundaries) -> np.ndarray:
        rows, n = self.confidence.shape
        starts = np.empty((rows, len(boundaries(0)) + 2), dtype=np.int64)
        starts[:, 0], starts[:, -1] = 0, n
        for row in range(rows):
            starts[row, 1:-1] = boundaries(row)
        return starts

    def uniform_sums(self, n_bins: int) -> np.ndarray:
        """``uniform_bin_index``'s bins: bin b starts at the first confidence c with c * B >= b."""
        scaled = self.confidence * n_bins  # monotone, so still sorted; the same product as uniform_bin_index
        thresholds = np.arange(1, n_bins)
        return self.sums(self._starts(lambda row: np.searchsorted(scaled[row], thresholds, side="left")))

    def equal_mass_sums(self, n_bins: int) -> np.ndarray:
        """Equal-mass bins: bin b holds the confidences in [e_b, e_(b+1)), e_b the ⌊bN/B⌋-th smallest (0-based).

        With distinct confidences every bin holds ⌊(b+1)N/B⌋ − ⌊bN/B⌋ samples; equal confidences
        always share a bin (bins are defined by values, not by the order of ties).
        """
        ranks = (np.arange(1, n_bins) * self.confidence.shape[1]) // n_bins
        values = self.confidence
        return self.sums(self._starts(lambda row: np.searchsorted(values[row], values[row, ranks], side="left")))


def calibration_inputs(logits: np.ndarray, labels: np.ndarray,
                       true_probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """-> (probability, outcome, p* of the same event or None) for one task: a binary task's p(positive) and label, a
    multi-class task's top-label confidence and whether it was right (the events ``ece@B`` bins)."""
    if np.ndim(logits) == 1:
        return expit(logits.astype(np.float64)), labels.astype(np.float64), true_probs
    p = softmax(logits.astype(np.float64), axis=1)
    predicted = p.argmax(1)
    rows = np.arange(len(p))
    truth = None if true_probs is None or np.ndim(true_probs) != 2 else true_probs[rows, predicted]
    return p[rows, predicted], (predicted == labels).astype(np.float64), truth
