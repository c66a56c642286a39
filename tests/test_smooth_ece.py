"""Our batched smooth ECE is relplot's smECE (the reference implementation), to 1e-6 (docs/explanation/metrics.md)."""

import numpy as np
import pytest
import relplot
from scipy.special import expit, logit

from mtl_cog.evaluation.metrics import CLAMP, compute_metrics, task_metrics
from mtl_cog.evaluation.smooth_ece import smooth_ece


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    n = 20_000
    z = rng.normal(0, 2, n)
    p = expit(z)
    draw = lambda q: (rng.random(q.shape) < q).astype(float)  # noqa: E731
    return {
        "calibrated": (p, draw(p)),
        "overconfident": (p, draw(expit(z / 3))),
        "underconfident": (p, draw(expit(3 * z))),
        "saturated": (np.clip(expit(rng.normal(0, 40, n)), CLAMP, 1 - CLAMP), draw(expit(rng.normal(0, 40, n)))),
        "constant prediction": (np.full(500, 0.8), draw(np.full(500, 0.6))),
        "all labels equal": (rng.uniform(0.1, 0.9, 300), np.ones(300)),
        "perfect and certain": (np.r_[np.full(50, CLAMP), np.full(50, 1 - CLAMP)], np.r_[np.zeros(50), np.ones(50)]),
        "one sample": (np.array([0.3]), np.array([1.0])),
        "two samples": (np.array([0.3, 0.9]), np.array([0.0, 1.0])),
        "small and skewed": (rng.beta(0.3, 3, 37), draw(rng.beta(0.3, 3, 37))),
    }


def test_rows_equal_relplot_smece_to_1e_6():
    cases = _cases()
    for name, (f, y) in cases.items():
        ours, width = smooth_ece(f[None], y[None])
        ref, ref_width = relplot.smECE(f, y, return_width=True)
        assert ours[0] == pytest.approx(ref, abs=1e-6), name
        assert width[0] == pytest.approx(ref_width, abs=1e-12), name  # the same bandwidth, not a nearby one


def test_many_rows_at_once_equal_one_at_a_time():
    rng = np.random.default_rng(1)
    n, rows = 5000, 12
    z = rng.normal(0, 2, (rows, n))
    f = expit(z)
    y = (rng.random((rows, n)) < expit(z * rng.uniform(0.2, 4, (rows, 1)))).astype(float)
    together, widths = smooth_ece(f, y)
    for r in range(rows):
        ref, ref_width = relplot.smECE(f[r], y[r], return_width=True)
        assert together[r] == pytest.approx(ref, abs=1e-6) and widths[r] == ref_width


def test_compute_metrics_scores_the_documented_inputs():
    """Binary: the clamped positive-class probability vs the label; K classes: top-label confidence vs correctness."""
    rng = np.random.default_rng(2)
    z = rng.normal(0, 3, 3000)
    y = rng.integers(0, 2, 3000)
    assert task_metrics(z, y, [15])["smece"] == pytest.approx(relplot.smECE(np.clip(expit(z), CLAMP, 1 - CLAMP), y),
                                                              abs=1e-6)
    logits = rng.normal(0, 2, (3000, 5))
    labels = rng.integers(0, 5, 3000)
    conf, correct = relplot.multiclass_logits_to_confidences(logits, labels)
    assert task_metrics(logits, labels, [15])["smece"] == pytest.approx(relplot.smECE(conf, correct), abs=1e-6)


def test_calibrated_predictions_have_small_smece_and_miscalibration_is_measured():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 100_000)
    y = (rng.random(p.size) < p).astype(int)
    assert task_metrics(logit(p), y, [15])["smece"] < 0.01
    # p̂ = p* + 0.1 on [0.05, 0.85]: smooth ECE sees the 0.1 shift (kernel smoothing blurs only the edges)
    shifted = np.clip(p, 0.05, 0.85)
    y = (rng.random(p.size) < shifted).astype(int)
    assert task_metrics(logit(shifted + 0.1), y, [15])["smece"] == pytest.approx(0.1, abs=0.01)


def test_non_finite_row_is_nan_and_leaves_the_others_alone():
    rng = np.random.default_rng(4)
    f = rng.uniform(0.1, 0.9, (3, 400))
    y = (rng.random((3, 400)) < f).astype(float)
    clean, _ = smooth_ece(f, y)
    f[1, 7] = np.nan
    values, widths = smooth_ece(f, y)
    assert np.isnan(values[1]) and np.isnan(widths[1])
    assert values[[0, 2]] == pytest.approx(clean[[0, 2]], abs=0)
    out = compute_metrics(["a", "b"], [logit(f[0]), np.where(np.isnan(f[1]), np.nan, 0.0)],
                          [y[0].astype(int), y[1].astype(int)], [15])
    assert np.isnan(out["tasks"]["b"]["smece"]) and not np.isnan(out["tasks"]["a"]["smece"])
