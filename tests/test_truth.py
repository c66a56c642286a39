"""Known-answer tests of the scores against true probabilities (mtl_cog/evaluation/truth.py)."""

import numpy as np
import pytest
from scipy.special import expit, logit

from mtl_cog.errors import TruthError
from mtl_cog.evaluation.metrics import task_metrics
from mtl_cog.evaluation.truth import task_truth_metrics, truth_metric_names, truth_metrics

BINS = [1, 5, 15]


def _labels(p_true: np.ndarray, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(p_true.shape) < p_true).astype(np.int64)


def test_perfect_probabilities_have_zero_noise_free_error():
    p_true = np.random.default_rng(1).uniform(0.02, 0.98, 5000)
    out = task_truth_metrics(logit(p_true), p_true, _labels(p_true), BINS)
    for name in truth_metric_names(BINS):
        if name.startswith("nf_") or name in ("prob_error", "kl_true", "excess_brier"):
            assert out[name] == pytest.approx(0, abs=1e-9), name
    # ... while the label-based ECE of the same perfect predictor is not zero (label noise)
    assert task_metrics(logit(p_true), _labels(p_true), [15])["ece@15"] > 0.005


def test_planted_shift_is_measured_exactly():
    # p̂ = p* + 0.05 everywhere: every bin's mean p̂ exceeds its mean p* by exactly 0.05
    p_true = np.random.default_rng(2).uniform(0.1, 0.85, 4000)
    out = task_truth_metrics(logit(p_true + 0.05), p_true, _labels(p_true), BINS)
    for b in BINS:
        for norm in ("ece", "rmsce", "mce"):
            assert out[f"nf_{norm}@{b}"] == pytest.approx(0.05, abs=1e-6)
    assert out["prob_error"] == pytest.approx(0.05, abs=1e-6)
    assert out["excess_brier"] == pytest.approx(2 * 0.05**2, abs=1e-6)


def test_planted_overconfidence_matches_a_plain_loop():
    rng = np.random.default_rng(3)
    p_true = expit(rng.normal(0, 1.5, 3000))
    p_hat = expit(2.0 * logit(p_true))  # temperature 1/2: overconfident
    out = task_truth_metrics(logit(p_hat), p_true, _labels(p_true), [10])
    gaps, weights = [], []
    for b in range(10):
        inside = (p_hat >= b / 10) & ((p_hat < (b + 1) / 10) if b < 9 else (p_hat <= 1))
        if inside.any():
            gaps.append(abs(p_hat[inside].mean() - p_true[inside].mean()))
            weights.append(inside.mean())
    gaps, weights = np.array(gaps), np.array(weights)
    assert out["nf_ece@10"] == pytest.approx((gaps * weights).sum(), abs=1e-9)
    assert out["nf_rmsce@10"] == pytest.approx(np.sqrt((gaps**2 * weights).sum()), abs=1e-9)
    assert out["nf_mce@10"] == pytest.approx(gaps.max(), abs=1e-9)
    # binning hides errors that cancel within a bin: |p̂ − p*| is larger than the binned error
    assert out["prob_error"] > out["nf_ece@10"] > 0.03


def test_bayes_floors_known_values_and_expectations():
    p_true = np.full(1000, 0.5)
    out = task_truth_metrics(np.zeros(1000), p_true, _labels(p_true), [15])
    assert out["bayes_nll_exp"] == pytest.approx(np.log(2))
    assert out["bayes_brier_exp"] == pytest.approx(0.5)
    assert out["bayes_accuracy_exp"] == pytest.approx(0.5)
    # the label-based floors are the scores of p* on this sample; their mean over many label draws
    # is the expected floor, and the model's expected NLL = Bayes floor + KL (exact identity)
    rng = np.random.default_rng(4)
    p_true = expit(rng.normal(0, 2, 400))
    z = rng.normal(0, 2, 400)
    draws = [task_truth_metrics(z, p_true, _labels(p_true, seed), [15]) for seed in range(300)]
    first = draws[0]
    for name in ("bayes_nll", "bayes_brier", "bayes_accuracy"):
        assert np.mean([d[name] for d in draws]) == pytest.approx(first[f"{name}_exp"], rel=0.02), name
    model_nll = np.mean([task_metrics(z, _labels(p_true, seed), [15])["nll"] for seed in range(300)])
    assert model_nll == pytest.approx(first["bayes_nll_exp"] + first["kl_true"], rel=0.02)
    model_brier = np.mean([task_metrics(z, _labels(p_true, seed), [15])["brier"] for seed in range(300)])
    assert model_brier == pytest.approx(first["bayes_brier_exp"] + first["excess_brier"], rel=0.02)


def test_multiclass_uses_top_label_and_total_variation():
    rng = np.random.default_rng(5)
    p_true = rng.dirichlet(np.ones(4), size=2000)
    out = task_truth_metrics(np.log(p_true), p_true, rng.integers(0, 4, 2000), [15])
    assert out["nf_ece@15"] == pytest.approx(0, abs=1e-9) and out["prob_error"] == pytest.approx(0, abs=1e-9)
    # binary written as two classes gives the same probability error as the one-logit form
    pb = rng.uniform(0.05, 0.95, 500)
    z = rng.normal(size=500)
    two = task_truth_metrics(np.stack([np.zeros(500), z], 1), np.stack([1 - pb, pb], 1), _labels(pb), [15])
    one = task_truth_metrics(z, pb, _labels(pb), [15])
    assert two["prob_error"] == pytest.approx(one["prob_error"]) and two["kl_true"] == pytest.approx(one["kl_true"])


def test_task_mean_and_shape_errors():
    p_true = [np.full(10, 0.3), np.full(10, 0.7)]
    out = truth_metrics(["a", "b"], [logit(p) for p in p_true], [_labels(p) for p in p_true], p_true, [5])
    assert out["mean"]["bayes_accuracy_exp"] == pytest.approx(0.7)
    with pytest.raises(TruthError, match="'a'"):
        task_truth_metrics(np.zeros(10), np.zeros(9), np.zeros(10, dtype=int), [5], task="a")
    with pytest.raises(TruthError, match="probabilities"):
        task_truth_metrics(np.zeros(3), np.array([0.1, 1.5, 0.2]), np.zeros(3, dtype=int), [5])
