"""Partly labelled tasks (MISSING_LABEL): every loss, metric and fit equals its value on the labelled subset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_aggregators import tiny_network

from mtl_cog.config import DataConfig, MethodConfig
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.loading import hide_labels, load_task
from mtl_cog.data.task_api import LogitLayout, TaskSpec, check_labels
from mtl_cog.errors import ConfigError, DataError, PredictionFileError
from mtl_cog.evaluation.margins import label_margin
from mtl_cog.evaluation.metrics import compute_metrics, metrics_frame, task_metrics
from mtl_cog.evaluation.posthoc import calibrate as posthoc_calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.robustness import certified_accuracy, certified_radii
from mtl_cog.evaluation.sharpness import margin_quantiles
from mtl_cog.evaluation.truth import labelled_truth_metrics, truth_metrics
from mtl_cog.models.heads import VariationalHeads
from mtl_cog.objectives import WithAuxiliaryLoss, build_objective, set_partial_labels
from mtl_cog.objectives.aggregators import build_aggregator
from mtl_cog.reporting.plots.reliability import pool_task as reliability_pool
from mtl_cog.reporting.run_report import write_run_report
from mtl_cog.reporting.shift_report import mean_risk_coverage
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss
from mtl_cog.training.step import batch_loss

LAYOUT = LogitLayout((2, 2, 2, 4))  # three binary tasks and one 4-class task
LOSSES = ["ce", "ls", "focal", "mbls", "margin_ce"]


def masked_batch(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, LAYOUT.total, generator=g) * 2
    labels = torch.stack([torch.randint(0, k, (n,), generator=g) for k in LAYOUT.num_classes], 1)
    hidden = torch.rand(labels.shape, generator=g) < 0.4
    return logits, labels.masked_fill(hidden, MISSING_LABEL), labels


@pytest.mark.parametrize("loss", LOSSES)
def test_masked_loss_is_the_loss_on_the_labelled_subset(loss):
    objective = build_objective(LAYOUT, MethodConfig(loss=loss))
    logits, labels, full = masked_batch()
    masked = objective(logits, labels)
    for t in range(LAYOUT.num_tasks):
        rows = labels[:, t] != MISSING_LABEL
        # the subset's other tasks keep their true labels: only task t's entry is compared
        subset = objective(logits[rows], full[rows])
        assert torch.allclose(masked[t], subset[t], atol=1e-6), (loss, t)


def test_fully_labelled_data_trains_bit_for_bit_as_before():
    """partial_labels=False (what fit sets for a fully labelled data set) and the per-batch look give the same bits."""
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    logits, _, full = masked_batch()
    looked = objective(logits, full)
    set_partial_labels(objective, False)
    assert torch.equal(objective(logits, full), looked)
    # and the per-sample contract reduced by .mean(0) is the library's own mean reduction
    binary = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, :3], full[:, :3].float(),
                                                                  reduction="none").mean(0)
    assert torch.equal(looked[:3], binary)


def test_a_task_without_labels_in_the_batch_has_zero_loss_and_no_gradient():
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    logits, labels, _ = masked_batch()
    labels[:, 1] = MISSING_LABEL
    labels[:, 3] = MISSING_LABEL
    logits.requires_grad_(True)
    losses = objective(logits, labels)
    assert losses[1] == 0 and losses[3] == 0 and torch.isfinite(losses).all()
    losses.sum().backward()
    assert (logits.grad[:, 1] == 0).all() and (logits.grad[:, 3:] == 0).all()


def prediction_lists(seed: int = 0, n: int = 200, hide: float = 0.3):
    rng = np.random.default_rng(seed)
    logits = [rng.normal(size=n) * 2, rng.normal(size=n), rng.normal(size=(n, 4))]
    labels = [rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 4, n)]
    masked = [np.where(rng.random(n) < hide, MISSING_LABEL, y) for y in labels]
    return logits, masked


def test_masked_metrics_are_the_metrics_of_the_labelled_subset():
    logits, labels = prediction_lists()
    bins = [5, 15]
    scored = compute_metrics(["a", "b", "c"], logits, labels, bins)
    for name, z, y in zip(["a", "b", "c"], logits, labels, strict=True):
        keep = y != MISSING_LABEL
        expected = task_metrics(z[keep], y[keep], bins)
        assert scored["tasks"][name] == pytest.approx(expected, rel=1e-12, nan_ok=True)
    # the pooled ECE pools every labelled (task, sample) event: the binary tasks' events scored as one task
    binary = compute_metrics(["a", "b"], logits[:2], labels[:2], bins)
    keep = [y != MISSING_LABEL for y in labels[:2]]
    pooled = task_metrics(np.concatenate([logits[0][keep[0]], logits[1][keep[1]]]),
                          np.concatenate([labels[0][keep[0]], labels[1][keep[1]]]), bins)
    assert binary["multitask"]["pooled_ece@15"] == pytest.approx(pooled["ece@15"], rel=1e-9)
    # the joint metrics use the samples labelled in both binary tasks
    both = keep[0] & keep[1]
    joint = compute_metrics(["a", "b"], [z[both] for z in logits[:2]], [y[both] for y in labels[:2]], bins)
    assert binary["multitask"]["count_ece"] == pytest.approx(joint["multitask"]["count_ece"], rel=1e-12)


def test_a_task_with_no_labelled_sample_is_refused():
    logits, labels = prediction_lists()
    labels[1] = np.full_like(labels[1], MISSING_LABEL)
    with pytest.raises(PredictionFileError, match="'b' has no labelled sample"):
        compute_metrics(["a", "b", "c"], logits, labels, [15])
    spec = TaskSpec("toy", ("a", "b"), (2, 2), (0.5,) * 3, (0.25,) * 3)
    with pytest.raises(DataError, match="no labelled sample"):
        check_labels(spec, np.array([[0, MISSING_LABEL], [1, MISSING_LABEL]]), "val")
    with pytest.raises(DataError, match="must lie in 0..1 or be -100"):  # CelebA's -1 ("no") is never "missing"
        check_labels(spec, np.array([[0, -1], [1, 0]]), "val")
    check_labels(spec, np.array([[0, MISSING_LABEL], [MISSING_LABEL, 1]]), "val")


@pytest.mark.parametrize("method", ["ts", "vs", "isotonic"])
def test_posthoc_fit_uses_only_labelled_rows(method):
    logits, labels = prediction_lists(n=300)
    keep = [y != MISSING_LABEL for y in labels]
    val = Predictions(["a", "b", "c"], logits, labels)
    test_logits, test_labels = prediction_lists(seed=1, n=50, hide=0.0)
    test = Predictions(["a", "b", "c"], test_logits, test_labels)
    calibrated = posthoc_calibrate(method, val, test)
    for t in range(3):  # each task fitted alone on its labelled rows gives the same calibrated test logits
        alone_val = Predictions(["x"], [logits[t][keep[t]]], [labels[t][keep[t]]])
        alone = posthoc_calibrate(method, alone_val, Predictions(["x"], [test_logits[t]], [test_labels[t]]))
        assert np.allclose(calibrated.logits[t], alone.logits[0], atol=1e-4), (method, t)


def test_hide_labels_is_seeded_and_hides_about_the_fraction():
    cfg = DataConfig(task="synthetic", root="/nonexistent", use_cache=False)
    cfg.synthetic.train_size, cfg.synthetic.val_size, cfg.synthetic.test_size = 300, 100, 100
    data = load_task(cfg)
    once, again = hide_labels(data, 0.3, seed=5), hide_labels(data, 0.3, seed=5)
    other = hide_labels(data, 0.3, seed=6)
    for name in ("train", "val", "test"):
        hidden = once.splits[name].labels == MISSING_LABEL
        assert torch.equal(once.splits[name].labels, again.splits[name].labels)
        assert not torch.equal(hidden, other.splits[name].labels == MISSING_LABEL)
        assert 0.25 < hidden.float().mean() < 0.35
        kept = ~hidden
        assert torch.equal(once.splits[name].labels[kept], data.splits[name].labels[kept])
    with pytest.raises(ConfigError, match="data.hide_labels"):
        DataConfig(hide_labels=1.0).validate()


def test_the_run_report_draws_partly_labelled_predictions(tmp_path):
    """Reliability figures use each task's labelled rows; nothing fails on the -100 entries."""
    logits, labels = prediction_lists()
    table = metrics_frame(compute_metrics(["a", "b", "c"], logits, labels, [15]))
    report = write_run_report(tmp_path, Predictions(["a", "b", "c"], logits, labels), table)
    assert report is not None and report.png.is_file()


# ------------------------------------ the other places that fit or score on labels (an audit of every use of labels)


def test_vtst_kl_term_on_a_masked_batch_is_the_term_on_each_tasks_labelled_rows():
    """V-TST's per-task NLL + KL / Z on task t's labelled subset, as its loss; fully labelled: bit for bit as before."""
    heads = VariationalHeads(6, LAYOUT, latent_dim=3)
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    loss = WithAuxiliaryLoss(objective, heads, weight=0.7)
    features = torch.randn(24, 6, generator=torch.Generator().manual_seed(0))
    _, labels, full = masked_batch()
    torch.manual_seed(5)
    logits = heads(features)
    kl = heads.auxiliary_terms().detach().clone()  # (B, T): this forward's per-sample terms
    masked = loss(logits, labels)
    for t in range(LAYOUT.num_tasks):
        rows = labels[:, t] != MISSING_LABEL
        expected = objective(logits[rows], full[rows])[t] + 0.7 * kl[rows, t].mean()
        assert torch.allclose(masked[t], expected, atol=1e-6), t
    assert torch.equal(loss(logits, full), objective(logits, full) + 0.7 * kl.mean(0))


@pytest.mark.parametrize("aggregator", ["equal", "mgda"])
def test_the_cog_leader_gradient_on_a_masked_batch_is_that_of_each_tasks_labelled_rows(aggregator,
                                                                                    fresh_accelerate_state):
    """COG-TS's leader (one temperature per task) follows the mean loss: task t's temperature gets
    (1/T) grad L_t of t's labelled rows, 0 for a task with no label in the batch, under any aggregator."""
    network = tiny_network(LAYOUT, calibrator="temperature")
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    images = torch.randn(16, 3, 2, 2, generator=torch.Generator().manual_seed(2))
    labels = torch.stack([torch.randint(0, k, (16,), generator=torch.Generator().manual_seed(3 + k))
                          for k in LAYOUT.num_classes], 1)
    hidden = torch.rand(labels.shape, generator=torch.Generator().manual_seed(4)) < 0.4
    hidden[:, 2] = True  # task 2: no label in this batch
    masked = labels.masked_fill(hidden, MISSING_LABEL)
    network.zero_grad()
    if aggregator == "equal":
        batch_loss(network, objective, images, masked).backward()
    else:
        aggregation = Aggregation(build_aggregator(aggregator, LAYOUT.num_tasks), "features")
        # an accelerator of its own: another test may have reset accelerate's process-wide state
        aggregated_loss(create_accelerator(), network, objective, aggregation, images, masked,
                        list(network.backbone.parameters())).backward.backward()
    got = network.calibrator.log_temperature.grad.clone()
    for t in range(LAYOUT.num_tasks):
        rows = ~hidden[:, t]
        if not rows.any():
            assert got[t] == 0
            continue
        network.zero_grad()
        (objective(network(images[rows]), labels[rows])[t] / LAYOUT.num_tasks).backward()
        assert torch.allclose(got[t], network.calibrator.log_temperature.grad[t], atol=1e-6), t


def test_certified_accuracy_and_margins_count_only_labelled_samples():
    logits, labels = prediction_lists()
    hidden = Predictions(["a", "b", "c"], logits, labels)
    lipschitz = np.array([2.0, 1.0, 3.0])
    radii = certified_radii(hidden, lipschitz)
    accuracy = certified_accuracy(hidden, lipschitz, [0.1, 0.5])
    for t, (z, y) in enumerate(zip(logits, labels)):
        keep = y != MISSING_LABEL
        alone = Predictions(["x"], [z[keep]], [y[keep]])
        assert np.array_equal(radii[t], certified_radii(alone, lipschitz[[t]])[0])
        assert accuracy["abc"[t]] == certified_accuracy(alone, lipschitz[[t]], [0.1, 0.5])["x"]
    pooled = np.concatenate([label_margin(z[y != MISSING_LABEL], y[y != MISSING_LABEL])
                             for z, y in zip(logits, labels)])
    assert margin_quantiles(logits, labels) == margin_quantiles([pooled], [np.ones(len(pooled), dtype=int)])


def test_figures_and_truth_metrics_use_labelled_rows():
    logits, labels = prediction_lists()
    rng = np.random.default_rng(7)
    truth = [rng.random(200), rng.random(200), rng.dirichlet(np.ones(4), 200)]
    hidden = Predictions(["a", "b", "c"], logits, labels, truth)
    # risk-coverage (run report and compare): each task's curve on its labelled rows
    grid, risk = mean_risk_coverage(hidden)
    alone = [mean_risk_coverage(Predictions(["x"], [z[y != MISSING_LABEL]], [y[y != MISSING_LABEL]]))[1]
             for z, y in zip(logits, labels)]
    assert np.allclose(risk, np.mean(alone, axis=0))
    # reliability figures pool each task's labelled rows
    prob, outcome, _, _ = reliability_pool([hidden], None)
    keep = [y != MISSING_LABEL for y in labels]
    assert len(prob) == sum(k.sum() for k in keep) and set(np.unique(outcome)) <= {0.0, 1.0}
    # truth metrics (run report and compare): the rows labelled in every task
    every = np.logical_and.reduce(keep)
    expected = truth_metrics(["a", "b", "c"], [z[every] for z in logits], [y[every] for y in labels],
                             [p[every] for p in truth], [15])
    assert labelled_truth_metrics(hidden, [15]) == expected
    assert labelled_truth_metrics(Predictions(["a", "b", "c"], logits, labels), [15]) is None  # no p*


def test_the_data_description_counts_labelled_entries_only():
    """prepare_data --describe on a data set with missing labels (it crashed on -100 in bincount)."""
    from mtl_cog.data.task_api import SplitData, TaskData
    from mtl_cog.reporting.data_description import correlated_pairs, describe_markdown, prevalence_rows

    g = torch.Generator().manual_seed(0)
    full = torch.stack([torch.randint(0, k, (60,), generator=g) for k in LAYOUT.num_classes], 1)
    full[:, 1] = torch.where(torch.rand(60, generator=g) < 0.8, full[:, 0], 1 - full[:, 0])  # correlated with a
    labels = full.masked_fill(torch.rand(full.shape, generator=g) < 0.3, MISSING_LABEL)
    spec = TaskSpec("toy", ("a", "b", "c", "k"), LAYOUT.num_classes, (0.5,) * 3, (0.2,) * 3)
    images = torch.zeros((60, 3, 4, 4), dtype=torch.uint8)
    data = TaskData(spec, {"train": SplitData(images, labels), "test": SplitData(images, labels)})
    rows = {name: shares["train"] for name, _, shares in prevalence_rows(data)}
    for t, name in enumerate(["a", "b", "c"]):
        known = labels[:, t][labels[:, t] != MISSING_LABEL]
        assert rows[name] == pytest.approx(float((known == 1).float().mean()))
    aligned = (labels[:, :3] != MISSING_LABEL).all(1)
    subset = TaskData(spec, {"train": SplitData(images[aligned], full[aligned])})
    assert correlated_pairs(data, 3) == correlated_pairs(subset, 3) and correlated_pairs(data, 3)[0][:2] == ("a", "b")
    assert "Input-blind predictor" in describe_markdown(data, 2)


def test_list_scale_update_fits_each_tasks_temperature_on_its_labelled_validation_rows():
    """LiST's L update (and calibration_drift's fitted T) use fit_temperatures: task by task, its labelled rows."""
    from mtl_cog.models.calibrators import fit_temperatures

    rng = np.random.default_rng(0)
    logits = [rng.normal(size=300) * 3, rng.normal(size=300) * 2, rng.normal(size=(300, 4)) * 3]
    # labels drawn from the logits at temperature 2 (over-confident logits): a finite optimum near T = 2
    chosen = [rng.random(300) < 1 / (1 + np.exp(-z / 2)) for z in logits[:2]]
    probs = np.exp(logits[2] / 2) / np.exp(logits[2] / 2).sum(1, keepdims=True)
    full = [c.astype(np.int64) for c in chosen] + [(rng.random(300)[:, None] > probs.cumsum(1)).sum(1)]
    labels = [np.where(rng.random(300) < 0.3, MISSING_LABEL, y) for y in full]
    layout = LogitLayout((2, 2, 4))
    masked = fit_temperatures(layout, logits, labels)
    assert ((masked > 1.3) & (masked < 3)).all()
    for t, (z, y) in enumerate(zip(logits, labels)):
        keep = y != MISSING_LABEL
        alone = fit_temperatures(LogitLayout((layout.num_classes[t],)), [z[keep]], [y[keep]])
        assert torch.allclose(masked[t], alone[0], rtol=1e-5), t
