"""The signed margin of the label, one task at a time: what sharpness reports and certified radii rest on."""

from __future__ import annotations

import numpy as np


def label_margin(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(N,) margin of the true class, > 0 iff correct: (2y − 1) z for one binary logit, z_y − max_{k≠y} z_k for K."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if z.ndim == 1:
        return (2 * y - 1) * z
    rows = np.arange(len(y))
    others = z.copy()
    others[rows, y] = -np.inf
    return z[rows, y] - others.max(1)
