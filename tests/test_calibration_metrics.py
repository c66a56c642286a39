"""Known answers for the metrics beyond binned ECE and for the multi-task metrics (docs/explanation/metrics.md)."""

import numpy as np
import pytest
from scipy.special import expit, logit
from sklearn.isotonic import IsotonicRegression

from mtl_cog.errors import PredictionFileError
from mtl_cog.evaluation.metrics import compute_metrics, format_table, metrics_frame, task_metrics
from mtl_cog.evaluation.multitask_metrics import count_calibration, select_pairs
from mtl_cog.evaluation.truth import truth_metrics


def _draw(p: np.ndarray, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(p.shape) < p).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Equal-mass (adaptive) ECE


def test_adaptive_ece_by_hand():
    conf = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9])
    y = np.array([0, 1, 1, 0, 1, 1, 1, 1])
    m = task_metrics(logit(conf), y, [2, 4])
    # two bins of four: |0.5 − 0.25| and |1 − 0.75|, each with weight 1/2
    assert m["adaece@2"] == pytest.approx(0.25, abs=1e-12)
    # four bins of two: |0.5 − 0.15|, |0.5 − 0.35|, |1 − 0.65|, |1 − 0.85|, each with weight 1/4
    assert m["adaece@4"] == pytest.approx((0.35 + 0.15 + 0.35 + 0.15) / 4, abs=1e-12)


def test_adaptive_ece_matches_a_plain_loop_when_n_is_not_a_multiple_of_bins():
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.02, 0.98, 1003)
    y = _draw(np.clip(conf + 0.1, 0, 1))
    n, bins = len(conf), 7
    order = np.argsort(conf)
    expected = 0.0
    for b in range(bins):  # bin b: the samples ranked ⌊bN/B⌋ .. ⌊(b+1)N/B⌋ − 1 (distinct confidences)
        inside = order[(b * n) // bins:((b + 1) * n) // bins]
        expected += len(inside) / n * abs(y[inside].mean() - conf[inside].mean())
    assert task_metrics(logit(conf), y, [bins])["adaece@7"] == pytest.approx(expected, abs=1e-12)


def test_adaptive_ece_keeps_ties_together_whatever_their_order():
    conf = np.full(1000, 0.8)
    y = np.r_[np.ones(600), np.zeros(400)].astype(int)
    values = set()
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(1000)
        m = task_metrics(logit(conf[perm]), y[perm], [10])
        values.add(round(m["adaece@10"], 12))
        assert m["adaece@10"] == pytest.approx(0.2, abs=1e-9)  # one bin: |0.6 − 0.8|
    assert len(values) == 1


# ---------------------------------------------------------------------------------------------
# Class-wise ECE


def test_classwise_ece_by_hand_and_only_for_multiclass():
    logits = np.tile(np.log([0.7, 0.2, 0.1]), (1000, 1))
    y = np.r_[np.zeros(600), np.ones(300), np.full(100, 2)].astype(int)
    m = task_metrics(logits, y, [10])
    # class 0: |0.6 − 0.7|, class 1: |0.3 − 0.2|, class 2: |0.1 − 0.1|, averaged over the 3 classes
    assert m["classwise_ece@10"] == pytest.approx(0.2 / 3, abs=1e-9)
    assert m["ece@10"] == pytest.approx(0.1, abs=1e-9)  # top label: confidence 0.7, accuracy 0.6
    out = compute_metrics(["bin", "multi"], [np.zeros(1000), logits], [y.clip(0, 1), y], [10])
    assert "classwise_ece@10" not in out["tasks"]["bin"]
    assert out["mean"]["classwise_ece@10"] == pytest.approx(0.2 / 3, abs=1e-9)  # over the tasks that have it


# ---------------------------------------------------------------------------------------------
# Brier score decomposition (CORP)


def test_brier_decomposition_by_hand():
    # forecasts 0.2, 0.2, 0.6, 0.8 with outcomes 0, 1, 0, 1: ties pooled (0.2 -> 1/2), then PAV pools
    # (1/2, 0) into 1/3: r = 1/3, 1/3, 1/3, 1. S(p) = 0.27, S(r) = 1/6, S(base rate 1/2) = 1/4.
    p = np.array([0.2, 0.2, 0.6, 0.8])
    m = task_metrics(logit(p), np.array([0, 1, 0, 1]), [5])
    assert m["brier_reliability"] == pytest.approx(2 * (0.27 - 1 / 6), abs=1e-12)  # x2: summed over both classes
    assert m["brier_resolution"] == pytest.approx(2 * (0.25 - 1 / 6), abs=1e-12)
    assert m["brier_uncertainty"] == pytest.approx(2 * 0.25, abs=1e-12)
    assert m["brier"] == pytest.approx(2 * 0.27, abs=1e-12)


@pytest.mark.parametrize("classes", [2, 4])
def test_brier_parts_add_up_and_match_isotonic_recalibration(classes):
    rng = np.random.default_rng(5)
    n = 4000
    if classes == 2:
        logits = rng.normal(0, 2, n)
        labels = _draw(expit(0.5 * logits))
        events = [(expit(logits), labels)]
        scale = 2
    else:
        logits = rng.normal(0, 2, (n, classes))
        labels = rng.integers(0, classes, n)
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        events = [(probs[:, k], (labels == k).astype(float)) for k in range(classes)]
        scale = 1
    m = task_metrics(logits, labels, [15])
    assert m["brier_reliability"] - m["brier_resolution"] + m["brier_uncertainty"] == pytest.approx(m["brier"],
                                                                                                    abs=1e-12)
    rel = res = unc = 0.0  # an independent reference: sklearn's isotonic regression per class
    for p, y in events:
        r = IsotonicRegression(out_of_bounds="clip").fit(p, y).predict(p)
        base = y.mean()
        rel += np.mean((p - y) ** 2) - np.mean((r - y) ** 2)
        res += np.mean((base - y) ** 2) - np.mean((r - y) ** 2)
        unc += base * (1 - base)
    assert m["brier_reliability"] == pytest.approx(scale * rel, abs=1e-9)
    assert m["brier_resolution"] == pytest.approx(scale * res, abs=1e-9)
    assert m["brier_uncertainty"] == pytest.approx(scale * unc, abs=1e-12)
    assert m["brier_reliability"] > 0.01 and m["brier_resolution"] >= 0


def test_calibrated_discrete_forecasts_have_zero_reliability():
    p = np.repeat([0.1, 0.5, 0.9], 1000)
    y = np.concatenate([np.r_[np.ones(k), np.zeros(1000 - k)] for k in (100, 500, 900)]).astype(int)
    m = task_metrics(logit(p), y, [10])
    assert m["brier_reliability"] == pytest.approx(0, abs=1e-12)
    assert m["brier_uncertainty"] == pytest.approx(2 * 0.5 * 0.5, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Multi-task metrics


def test_pooled_worst_and_p90_by_hand():
    # task a: p = 0.8, 60% positive (overconfident by 0.2); task b: p = 0.8, all positive (under by 0.2)
    z = np.full(1000, logit(0.8))
    ya = np.r_[np.ones(600), np.zeros(400)].astype(int)
    out = compute_metrics(["a", "b"], [z, z], [ya, np.ones(1000, dtype=int)], [10])
    assert out["tasks"]["a"]["ece@10"] == pytest.approx(0.2) and out["tasks"]["b"]["ece@10"] == pytest.approx(0.2)
    assert out["multitask"]["pooled_ece@10"] == pytest.approx(0.0, abs=1e-9)  # opposite gaps cancel in the pool
    assert out["multitask"]["worst_task_ece@10"] == pytest.approx(0.2)
    assert out["multitask"]["p90_task_ece@10"] == pytest.approx(0.2)
    # ten tasks with ECE 0.00, 0.01, ..., 0.09: worst 0.09, 90th percentile 0.081 (linear interpolation)
    shifts = np.arange(10) / 100
    p = np.full(2000, 0.5)
    out = compute_metrics([f"t{i}" for i in range(10)], [logit(p + s) for s in shifts],
                          [np.r_[np.ones(1000), np.zeros(1000)].astype(int)] * 10, [5])
    assert out["multitask"]["worst_task_ece@5"] == pytest.approx(0.09, abs=1e-9)
    assert out["multitask"]["p90_task_ece@5"] == pytest.approx(0.081, abs=1e-9)
    assert out["multitask"]["pooled_ece@5"] == pytest.approx(shifts.mean(), abs=1e-9)  # one shared bin per value


def test_count_calibration_by_hand():
    # expected counts 0.4 -> bin 0; 1.6 and 2.2 -> bin 2; actual counts 0, 3, 1
    curve = count_calibration(np.array([0.4, 1.6, 2.2]), np.array([0.0, 3.0, 1.0]), 3)
    assert list(curve.samples) == [1, 0, 2, 0]
    assert curve.mean_expected[2] == pytest.approx(1.9) and curve.mean_actual[2] == pytest.approx(2.0)
    assert curve.ece == pytest.approx((1 * 0.4 + 2 * 0.1) / 3)
    # through compute_metrics: 3 binary tasks, p = 0.5 each -> expected count 1.5 (bin 2 of [1.5, 2.5))
    labels = [np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]), np.array([1, 1, 1, 0])]
    out = compute_metrics(["a", "b", "c"], [np.zeros(4)] * 3, labels, [5])
    assert out["multitask"]["count_ece"] == pytest.approx(abs(6 / 4 - 1.5), abs=1e-12)  # mean actual count 1.5
    labels[2] = np.ones(4, dtype=int)
    out = compute_metrics(["a", "b", "c"], [np.zeros(4)] * 3, labels, [5])
    assert out["multitask"]["count_ece"] == pytest.approx(abs(7 / 4 - 1.5), abs=1e-12)


def test_most_correlated_pairs_are_chosen():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, 500)
    noise = rng.integers(0, 2, (2, 500))
    constant = np.ones(500)
    labels = np.stack([a, noise[0], 1 - a, constant, np.where(rng.random(500) < 0.9, a, noise[1])]).astype(float)
    chosen = select_pairs(labels, 2)
    assert [(i, j) for i, j, _ in chosen] == [(0, 2), (2, 4)] or [(i, j) for i, j, _ in chosen] == [(0, 2), (0, 4)]
    assert chosen[0][2] == pytest.approx(-1.0)
    assert all(3 not in (i, j) for i, j, _ in select_pairs(labels, 100))  # a constant label has no correlation
    assert len(select_pairs(labels, 100)) == 6 and select_pairs(labels, 0) == []


def test_pair_joint_error_shows_what_independent_heads_cannot_express():
    # attribute b is a copy of attribute a: each head predicts p* exactly (perfect marginals), but the
    # model's joint p_a * p_b = p*^2 while the true joint is p*: a large joint error
    rng = np.random.default_rng(8)
    p_true = rng.uniform(0.2, 0.8, 50_000)
    ya = _draw(p_true)
    yc = _draw(rng.uniform(0.2, 0.8, 50_000), 1)
    out = compute_metrics(["a", "b", "c"], [logit(p_true)] * 2 + [np.zeros(50_000)], [ya, ya, yc], [15], pairs=1)
    assert out["tasks"]["a"]["ece@15"] < 0.01 and out["tasks"]["b"]["ece@15"] < 0.01
    (pair,) = out["pairs"]
    assert (pair["a"], pair["b"]) == ("a", "b") and pair["correlation"] == pytest.approx(1.0)
    assert pair["observed"] == pytest.approx(ya.mean()) and pair["predicted"] == pytest.approx(np.mean(p_true**2))
    gap = np.mean(p_true - p_true**2)  # E[p* − p*²], seen in every equal-mass bin with the same sign
    assert out["multitask"]["pair_joint_ece"] == pytest.approx(gap, abs=0.01) and gap > 0.15


def _independent_labels(n: int, tasks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p* with correlated attributes (a shared latent) and labels drawn independently given it."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, 1))
    p_true = expit(u @ rng.normal(1.5, 0.3, (1, tasks)) + rng.normal(0, 0.5, tasks))
    return p_true, _draw(p_true, seed + 1)


def test_count_and_pair_errors_of_the_truth_vanish_in_expectation():
    """p̂ = p*: the label-based errors are sampling noise (shrinking like 1/sqrt(N)); the noise-free ones are 0."""
    tasks = 6
    names = [f"t{i}" for i in range(tasks)]

    def mean_errors(n: int, draws: int, temperature: float = 1.0) -> np.ndarray:
        values = []
        for seed in range(draws):
            p_true, y = _independent_labels(n, tasks, 100 * seed)
            out = compute_metrics(names, [logit(p_true[:, t]) / temperature for t in range(tasks)],
                                  [y[:, t] for t in range(tasks)], [15], pairs=3)
            values.append([out["multitask"]["count_ece"], out["multitask"]["pair_joint_ece"]])
        return np.mean(values, axis=0)

    small, large = mean_errors(1_000, 12), mean_errors(16_000, 12)
    assert np.all(large < 0.4 * small)  # 16x the samples: errors ~4x smaller, towards 0
    assert large[0] < 0.04 and large[1] < 0.01
    overconfident = mean_errors(16_000, 2, temperature=0.4)  # a miscalibrated model keeps a floor
    assert np.all(overconfident > 5 * large)

    p_true, y = _independent_labels(5_000, tasks, 0)
    truth = truth_metrics(names, [logit(p_true[:, t]) for t in range(tasks)], [y[:, t] for t in range(tasks)],
                          [p_true[:, t] for t in range(tasks)], [15], pairs=3)
    assert truth["multitask"]["nf_count_ece"] == pytest.approx(0, abs=1e-9)
    assert truth["multitask"]["nf_pair_joint_ece"] == pytest.approx(0, abs=1e-9)
    assert truth["multitask"]["nf_pooled_ece@15"] == pytest.approx(0, abs=1e-9)
    assert truth["mean"]["nf_smece"] == pytest.approx(0, abs=1e-9)


def test_noise_free_multitask_metrics_measure_a_planted_shift():
    tasks = 4
    p_true, y = _independent_labels(3_000, tasks, 3)
    p_true = np.clip(p_true, 0.05, 0.9)
    truth = truth_metrics([f"t{i}" for i in range(tasks)], [logit(p_true[:, t] + 0.05) for t in range(tasks)],
                          [y[:, t] for t in range(tasks)], [p_true[:, t] for t in range(tasks)], [10], pairs=2)
    assert truth["multitask"]["nf_count_ece"] == pytest.approx(4 * 0.05, abs=1e-9)  # every sample: +0.05 per task
    assert truth["multitask"]["nf_pooled_ece@10"] == pytest.approx(0.05, abs=1e-9)
    assert truth["multitask"]["nf_worst_task_ece@10"] == pytest.approx(0.05, abs=1e-9)
    assert truth["multitask"]["nf_pair_joint_ece"] > 0.02


# ---------------------------------------------------------------------------------------------
# What is computed where, and degenerate input


def test_which_multitask_metrics_exist():
    rng = np.random.default_rng(9)
    z, y = rng.normal(size=200), rng.integers(0, 2, 200)
    single = compute_metrics(["a"], [z], [y], [15])
    assert set(single) == {"tasks", "mean"}  # one task: nothing beyond its own ECE
    mixed = compute_metrics(["a", "m"], [z, rng.normal(size=(200, 3))], [y, rng.integers(0, 3, 200)], [15])
    assert set(mixed["multitask"]) == {"pooled_ece@15", "worst_task_ece@15", "p90_task_ece@15"}
    assert "pairs" not in mixed  # one binary task: no count, no pairs
    two = compute_metrics(["a", "b"], [z, z], [y, 1 - y], [15], pairs=0)
    assert "count_ece" in two["multitask"] and "pair_joint_ece" not in two["multitask"] and "pairs" not in two
    constant = compute_metrics(["a", "b"], [z, z], [y, np.ones(200, dtype=int)], [15])
    assert "pair_joint_ece" not in constant["multitask"]  # the only pair has a label that never varies
    frame = metrics_frame(two)
    assert frame.set_index("task").loc["mean", "count_ece"] == two["multitask"]["count_ece"]
    assert np.isnan(frame.set_index("task").loc["a", "count_ece"])
    assert "multi-task: pooled ECE" in format_table(two)


def test_non_finite_logits_give_nan_not_a_number():
    rng = np.random.default_rng(10)
    z = rng.normal(size=(3, 300))
    y = rng.integers(0, 2, (3, 300))
    z[1, 5] = np.nan
    out = compute_metrics(["a", "b", "c"], list(z), list(y), [15])
    assert all(np.isnan(v) for v in out["tasks"]["b"].values())  # accuracy too: NaN predicts nothing
    assert not any(np.isnan(v) for v in out["tasks"]["a"].values())
    assert np.isnan(out["multitask"]["worst_task_ece@15"]) and np.isnan(out["multitask"]["pooled_ece@15"])
    assert np.isnan(out["multitask"]["count_ece"]) and np.isnan(out["mean"]["ece@15"])
    logits = rng.normal(size=(300, 4))
    logits[3, 2] = np.inf
    m = task_metrics(logits, rng.integers(0, 4, 300), [15])
    assert all(np.isnan(v) for v in m.values())


def test_empty_wrong_and_read_only_input():
    with pytest.raises(PredictionFileError, match="nothing to score"):
        compute_metrics(["a"], [np.zeros(0)], [np.zeros(0, dtype=int)], [15])
    z = np.random.default_rng(11).normal(size=(500, 3))
    y = np.random.default_rng(12).integers(0, 3, 500)
    z.setflags(write=False)
    y.setflags(write=False)
    before = z.copy()
    m = task_metrics(z, y, [15])  # read-only input is read, never written
    assert np.array_equal(z, before) and np.isfinite(list(m.values())).all()
    huge = task_metrics(np.r_[np.full(50, 1e4), np.full(50, -1e4)], np.r_[np.ones(50), np.zeros(50)].astype(int),
                        [15])
    assert huge["nll"] == pytest.approx(0, abs=1e-12) and huge["smece"] < 1e-6 and huge["brier_reliability"] == 0


def test_test_metrics_csv_with_multitask_and_partial_columns_reads_back_and_damage_is_still_refused(tmp_path):
    from mtl_cog.bundles.run_records import _read_metrics_csv
    from mtl_cog.errors import ReportError

    rng = np.random.default_rng(13)
    names = ["a", "b", "digit"]
    logits = [rng.normal(size=300), rng.normal(size=300), rng.normal(size=(300, 4))]
    labels = [rng.integers(0, 2, 300), rng.integers(0, 2, 300), rng.integers(0, 4, 300)]
    frame = metrics_frame(compute_metrics(names, logits, labels, [5, 15]))
    path = tmp_path / "test_metrics.csv"
    frame.to_csv(path, index=False)
    assert list(_read_metrics_csv(path, names)["task"]) == [*names, "mean"]  # count_ece only in the mean row: fine
    for column, row in (("count_ece", 3), ("classwise_ece@5", 2), ("ece@15", 0)):
        damaged = frame.copy()
        damaged.loc[row, column] = np.nan
        damaged.to_csv(path, index=False)
        with pytest.raises(ReportError, match="empty cells"):
            _read_metrics_csv(path, names)


def test_perfectly_calibrated_heads_of_a_copied_label_score_about_a_sixth_on_pair_joint_ece():
    """pair_joint_ece measures the joint implied by independent heads, not the heads' calibration.

    Head a predicts p (uniform), y_a ~ Bernoulli(p); head b predicts p too and y_b = y_a: both heads
    are perfectly calibrated, yet p_a p_b = p^2 against P(a and b) = p, E|p - p^2| = 1/6.
    """
    rng = np.random.default_rng(0)
    p = rng.uniform(0.001, 0.999, 50_000)
    y = (rng.uniform(size=p.size) < p).astype(np.int64)
    scores = compute_metrics(["a", "b"], [logit(p), logit(p)], [y, y], [15], pairs=1)
    assert scores["tasks"]["a"]["ece@15"] < 0.01 and scores["tasks"]["b"]["ece@15"] < 0.01
    assert scores["multitask"]["pair_joint_ece"] == pytest.approx(1 / 6, abs=0.015)


def test_ranks_never_use_the_joint_metrics():
    from mtl_cog.analysis.paired import RANK_METRICS

    assert RANK_METRICS == ("accuracy", "nll", "brier")
