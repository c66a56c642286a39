"""Known-answer tests for the metrics and their conventions (docs/explanation/metrics.md)."""

import numpy as np
import pytest

from mtl_cog.evaluation.metrics import compute_metrics, metric_names, task_metrics

BINS = [5, 10, 15, 20, 50]


def test_names():
    names = metric_names(BINS)
    assert names[:3] == ["accuracy", "nll", "brier"]
    assert "ece@15" in names and "rmsce@50" in names and "mce@5" in names
    assert "smece" in names and "adaece@50" in names and "brier_reliability" in names
    assert len(names) == 3 + 3 * 5 + 1 + 5 + 3 + 2 and "classwise_ece@5" not in names
    assert names[-2:] == ["aurc", "eaurc"]
    assert metric_names(BINS, multiclass=True)[-5:] == [f"classwise_ece@{b}" for b in BINS]


def test_perfectly_calibrated_binary_has_small_ece():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 200_000)
    y = (rng.random(z.size) < 1 / (1 + np.exp(-z))).astype(int)
    m = task_metrics(z, y, BINS)
    assert m["ece@15"] < 0.005 and m["rmsce@15"] < 0.006


def test_binary_brier_nll_accuracy_by_hand():
    z = np.array([0.0, 2.0, -1.0, 3.0])
    y = np.array([1, 0, 0, 1])
    p = 1 / (1 + np.exp(-z))
    m = task_metrics(z, y, BINS)
    assert m["brier"] == pytest.approx(np.mean(2 * (p - y) ** 2), rel=1e-5)  # summed over the two classes
    assert m["nll"] == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)), rel=1e-5)
    assert m["accuracy"] == pytest.approx(np.mean((p > 0.5) == y))


def test_binary_ece_uses_positive_class_probability():
    # every sample predicts p = 0.8 for the positive class; 60% are positive: ECE = |0.8 - 0.6| = 0.2
    z = np.full(1000, np.log(0.8 / 0.2))
    y = np.r_[np.ones(600), np.zeros(400)].astype(int)
    m = task_metrics(z, y, BINS)
    assert m["ece@10"] == pytest.approx(0.2, abs=1e-4)
    assert m["mce@10"] == pytest.approx(0.2, abs=1e-4)


def test_confidence_of_exactly_one_falls_in_the_last_bin():
    # saturated logits: p = 1.0 in float32; all correct -> calibration error ~0, not a phantom bin
    z = np.full(100, 100.0)
    y = np.ones(100, dtype=int)
    m = task_metrics(z, y, BINS)
    assert m["ece@15"] < 1e-5 and m["mce@15"] < 1e-5


def test_multiclass_top_label():
    # confidence 0.7 on class 0 always, correct 70% of the time -> ECE 0
    logits = np.tile(np.log([0.7, 0.2, 0.1]), (1000, 1))
    y = np.r_[np.zeros(700), np.ones(200), np.full(100, 2)].astype(int)
    m = task_metrics(logits, y, BINS)
    assert m["ece@15"] == pytest.approx(0.0, abs=1e-4)
    assert m["accuracy"] == pytest.approx(0.7)
    expected_brier = 0.7 * ((0.3) ** 2 + 0.2**2 + 0.1**2) + 0.2 * (0.7**2 + 0.8**2 + 0.1**2) + 0.1 * (
        0.7**2 + 0.2**2 + 0.9**2
    )
    assert m["brier"] == pytest.approx(expected_brier, rel=1e-4)


def test_mean_is_unweighted_over_tasks():
    rng = np.random.default_rng(1)
    z1, z2 = rng.normal(size=100), rng.normal(size=(100, 3))
    y1, y2 = rng.integers(0, 2, 100), rng.integers(0, 3, 100)
    out = compute_metrics(["a", "b"], [z1, z2], [y1, y2], [15])
    for m in ("accuracy", "nll", "ece@15"):
        assert out["mean"][m] == pytest.approx((out["tasks"]["a"][m] + out["tasks"]["b"][m]) / 2)


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_agrees_with_probmetrics(kind):
    """probmetrics is the reference implementation of every metric and convention."""
    import torch
    from probmetrics.metrics import Metrics

    rng = np.random.default_rng(2)
    if kind == "binary":
        z = rng.normal(0, 3, 5000)
        y = rng.integers(0, 2, 5000)
        ref_logits = torch.tensor(np.stack([np.zeros_like(z), z], 1), dtype=torch.float32)
    else:
        z = rng.normal(0, 3, (5000, 4))
        y = rng.integers(0, 4, 5000)
        ref_logits = torch.tensor(z, dtype=torch.float32)
    names = ["accuracy", "logloss", "brier"] + [f"{n}-{b}" for n in ("ece", "rmsce", "mce") for b in BINS]
    ref = Metrics.from_names(names).compute_all_from_labels_logits(torch.tensor(y), ref_logits)
    ours = task_metrics(z, y, BINS)
    for name in names:
        key = {"logloss": "nll"}.get(name, name.replace("-", "@"))
        assert ours[key] == pytest.approx(float(ref[name]), abs=2e-5), name
