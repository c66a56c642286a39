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


def decompose_sorted(p_sorted: np.ndarray, y_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean squared error S(p, y) (C,) and its CORP (reliability, resolution, uncertainty) (3, C).

    p, y (C, N), each row sorted by p, y in {0, 1}; one row per event (a task, or a class of a
    K-class task). Equal forecasts of a row are pooled (counted, their outcomes summed) in one
    pass over all rows; then PAV runs on each row's pooled outcome means, weighted by the counts.
    """
    rows, n = p_sorted.shape
    error = p_sorted - y_sorted
    s_forecast = np.einsum("ij,ij->i", error, error) / n
    base_rate = y_sorted.mean(1)
    s_climatology = base_rate * (1 - base_rate)  # S(ȳ, y) = mean (y − ȳ)² for 0/1 outcomes
    new_group = np.ones((rows, n), dtype=bool)
    new_group[:, 1:] = p_sorted[:, 1:] != p_sorted[:, :-1]
    starts = np.flatnonzero(new_group)  # in the flattened (rows * n) array: groups never span two rows
    counts = np.diff(np.append(starts, rows * n)).astype(np.float64)
    sum_y = np.add.reduceat(y_sorted.ravel(), starts)
    row_bounds = np.searchsorted(starts, np.arange(rows + 1) * n)
    s_recalibrated = np.empty(rows)
    for row in range(rows):
        group = slice(row_bounds[row], row_bounds[row + 1])
        r = isotonic_regression(sum_y[group] / counts[group], weights=counts[group]).x
        # Σ over the group's samples of (r − y)², with y² = y for 0/1 outcomes
        s_recalibrated[row] = np.sum(counts[group] * r * r - 2 * r * sum_y[group] + sum_y[group]) / n
    return s_forecast, np.stack([s_forecast - s_recalibrated, s_climatology - s_recalibrated, s_climatology])
