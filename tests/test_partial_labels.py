"""Partly labelled tasks (MISSING_LABEL): every loss, metric and fit equals its value on the labelled subset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_cog.config import DataConfig, MethodConfig
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.loading import hide_labels, load_task
from mtl_cog.data.task_api import LogitLayout, TaskSpec, check_labels
from mtl_cog.errors import ConfigError, DataError, PredictionFileError
from mtl_cog.evaluation.metrics import compute_metrics, metrics_frame, task_metrics
from mtl_cog.evaluation.posthoc import calibrate as posthoc_calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.objectives import build_objective, set_partial_labels
from mtl_cog.reporting.run_report import write_run_report

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
