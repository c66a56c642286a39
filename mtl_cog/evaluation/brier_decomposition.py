"""The Brier score split into reliability, resolution and uncertainty, exactly and without bins.

Murphy (1973) writes the Brier score of a binary event as REL − RES + UNC: *reliability* (how far
the forecasts are from the outcome frequency among samples with the same forecast), *resolution*
(how far those frequencies are from the base rate) and *uncertainty* (the Brier score of always
forecasting the base rate, ō (1 − ō)). With continuous forecasts no two samples share a forecast,
and the usual fix, binning the forecasts, leaves within-bin terms so that the three parts no
longer add up to the Brier score. We use the CORP estimator (Dimitriadis, Gneiting & Jordan,
2021, *Stable reliability diagrams for probabilistic classifiers*, PNAS): the recalibrated
forecast r is the isotonic (PAV) regression of the outcome on the forecast, and with S the mean
squared error,

    reliability = S(p, y) − S(r, y)   (≥ 0; "miscalibration", MCB)
    resolution  = S(ō, y) − S(r, y)   (≥ 0; "discrimination", DSC)
    uncertainty = S(ō, y) = ō (1 − ō)

so that S(p, y) = reliability − resolution + uncertainty holds exactly. Samples with the same
forecast are pooled before PAV (r must be a function of p). PAV is ``scipy.optimize.isotonic_regression``.

Our Brier score sums over classes (mtl_cog.evaluation.metrics): a K-class task is decomposed
one class at a time (the event "y = k" forecast by p_k) and the parts are summed over classes; a
binary task is 2 × the decomposition of its positive class (the negative class's is identical).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression


def _decompose_sorted(p: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """One event, forecasts ``p`` sorted ascending with their outcomes ``y`` -> (REL, RES, UNC)."""
    n = len(p)
    starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])  # groups of equal forecasts
    counts = np.diff(np.r_[starts, n])
    sum_y = np.add.reduceat(y, starts)
    sum_yy = np.add.reduceat(y * y, starts)
    r = isotonic_regression(sum_y / counts, weights=counts.astype(np.float64)).x
    base = y.mean()
    s_forecast = np.mean((p - y) ** 2)
    s_recalibrated = float(np.sum(counts * r * r - 2 * r * sum_y + sum_yy)) / n
    s_climatology = float(np.sum((y - base) ** 2)) / n
    return s_forecast - s_recalibrated, s_climatology - s_recalibrated, s_climatology


def decompose_sorted(p_sorted: np.ndarray, y_sorted: np.ndarray) -> np.ndarray:
    """CORP (reliability, resolution, uncertainty) of each row: p, y (C, N), each row sorted by p -> (3, C).

    One row per event (a task, or a class of a K-class task).
    """
    out = np.empty((3, len(p_sorted)))
    for c in range(len(p_sorted)):
        out[:, c] = _decompose_sorted(p_sorted[c], y_sorted[c])
    return out


def decompose(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``decompose_sorted`` of rows in any order: p, y (C, N) -> (3, C)."""
    order = np.argsort(p, axis=1)
    return decompose_sorted(np.take_along_axis(p, order, 1), np.take_along_axis(y, order, 1))
