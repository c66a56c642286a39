"""Selective prediction: AURC / E-AURC against hand-worked values and an independent implementation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mtl_cog.evaluation.metrics import compute_metrics, task_metrics
from mtl_cog.evaluation.selective import aurc_rows, ideal_aurc, risk_coverage


def reference_aurc(confidence, error):
    """Geifman et al.'s definition, written independently: sort, then the mean of the running error rate."""
    order = sorted(range(len(confidence)), key=lambda i: -confidence[i])
    risks, wrong = [], 0
    for k, i in enumerate(order, start=1):
        wrong += error[i]
        risks.append(wrong / k)
    aurc = sum(risks) / len(risks)
    n_err = int(sum(error))
    ideal_errors = [0] * (len(error) - n_err) + [1] * n_err
    ideal, wrong = [], 0
    for k, e in enumerate(ideal_errors, start=1):
        wrong += e
        ideal.append(wrong / k)
    return aurc, aurc - sum(ideal) / len(ideal)


def test_hand_worked_example():
    # confidences 0.9 > 0.8 > 0.7 > 0.6 with errors 0, 1, 0, 1: risks 0, 1/2, 1/3, 1/2 -> AURC = 1/3;
    # ideal order (errors last): 0, 0, 1/3, 1/2 -> 5/24; E-AURC = 1/3 - 5/24 = 1/8.
    out = aurc_rows(np.array([[0.9, 0.8, 0.7, 0.6]]), np.array([[0, 1, 0, 1]]))
    assert out["aurc"][0] == pytest.approx(1 / 3, abs=1e-15)
    assert out["eaurc"][0] == pytest.approx(1 / 8, abs=1e-15)
    coverage, risk = risk_coverage(np.array([0.9, 0.8, 0.7, 0.6]), np.array([0, 1, 0, 1]))
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 0.5, 1 / 3, 0.5])


def test_binary_task_uses_max_p_one_minus_p_and_the_sign_of_the_logit():
    # |z| orders 2.2 > 1.4 > 0.9 > 0.5; z <= 0 predicts 0, so with y = 1 the errors are 0, 1, 0, 1 (as above)
    m = task_metrics(np.array([-0.5, 2.2, 0.9, -1.4]), np.array([1, 1, 1, 1]), [15])
    assert m["aurc"] == pytest.approx(1 / 3, abs=1e-15)
    assert m["eaurc"] == pytest.approx(1 / 8, abs=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_an_independent_implementation(seed):
    rng = np.random.default_rng(seed)
    n = 997
    z = rng.normal(0, 2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z / 2))).astype(np.int64)
    m = task_metrics(z, y, [15])
    p = 1 / (1 + np.exp(-z))
    aurc, eaurc = reference_aurc(np.maximum(p, 1 - p).tolist(), ((z > 0) != (y == 1)).astype(int).tolist())
    assert abs(m["aurc"] - aurc) < 1e-12
    assert abs(m["eaurc"] - eaurc) < 1e-12
    # a 5-class task: top-label confidence and correctness
    logits = rng.normal(0, 2, (n, 5))
    labels = rng.integers(0, 5, n)
    m = task_metrics(logits, labels, [15])
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    aurc, eaurc = reference_aurc(probs.max(1).tolist(), (probs.argmax(1) != labels).astype(int).tolist())
    assert abs(m["aurc"] - aurc) < 1e-12
    assert abs(m["eaurc"] - eaurc) < 1e-12


def test_ideal_ordering_has_zero_eaurc():
    error = np.array([[0] * 30 + [1] * 7])
    confidence = np.linspace(1, 0.5, 37)[None]  # decreasing: every error after every correct answer
    out = aurc_rows(confidence, error)
    assert abs(out["eaurc"][0]) < 1e-15
    assert out["aurc"][0] == pytest.approx(ideal_aurc(np.array([7]), 37)[0], abs=1e-15)
    assert aurc_rows(confidence, np.zeros((1, 37)))["aurc"][0] == 0  # no errors: no risk at any coverage


def test_closed_form_of_the_ideal_area_matches_the_sum():
    for n, e in [(1, 0), (1, 1), (10, 3), (20000, 4321), (20000, 20000)]:
        direct = sum((k - (n - e)) / k for k in range(n - e + 1, n + 1)) / n
        assert abs(ideal_aurc(np.array([e]), n)[0] - direct) < 1e-12


def test_ties_are_spread_evenly_so_the_order_of_tied_samples_does_not_matter():
    confidence = np.array([0.9, 0.9, 0.5, 0.5, 0.5, 0.2])
    error = np.array([1, 0, 0, 1, 1, 0])
    expected = np.mean([reference_aurc(confidence[list(p)].tolist(), error[list(p)].tolist())[0]
                        for p in itertools.permutations(range(6))])  # random tie-breaking, averaged exactly
    for perm in itertools.permutations(range(6)):
        got = aurc_rows(confidence[list(perm)][None], error[list(perm)][None])["aurc"][0]
        assert got == pytest.approx(expected, abs=1e-15)


def test_columns_in_compute_metrics_and_nan_for_non_finite_logits():
    rng = np.random.default_rng(0)
    z = [rng.normal(size=50), rng.normal(size=50)]
    z[1][3] = np.nan
    y = [rng.integers(0, 2, 50), rng.integers(0, 2, 50)]
    out = compute_metrics(["a", "b"], z, y, [15])
    assert np.isfinite(out["tasks"]["a"]["aurc"]) and np.isnan(out["tasks"]["b"]["eaurc"])
    assert "aurc" in out["mean"] and "eaurc" in out["mean"]


def test_many_runs_of_ties_in_many_rows_match_a_loop_over_runs():
    rng = np.random.default_rng(5)
    confidence = np.round(rng.random((4, 300)), 2)  # ~100 distinct values: runs everywhere
    error = (rng.random((4, 300)) < 0.3).astype(float)
    got = aurc_rows(confidence, error)["aurc"]
    for row in range(4):
        order = np.argsort(-confidence[row], kind="stable")
        conf, err = confidence[row][order], error[row][order]
        cum, total, k = [], 0.0, 0
        for value in dict.fromkeys(conf):  # runs in order of decreasing confidence
            run = err[conf == value]
            for j in range(1, len(run) + 1):  # expected errors after j of the run, in a random order
                cum.append(total + j * run.sum() / len(run))
            total += run.sum()
            k += len(run)
        expected = np.mean(np.array(cum) / np.arange(1, 301))
        assert abs(got[row] - expected) < 1e-12
