"""Stability scaling: perturbations, the stability score's known answers, the fit on validation, partly
labelled validation and test data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.metrics import task_metrics
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.evaluation.stability import PERTURBATIONS, fit_stability, perturb, stability, stability_calibrate

LAYOUT = LogitLayout((2, 4))  # a binary task (one logit) and a 4-class task: 5 columns


class Constant(nn.Module):
    """Ignores its input: the same logits for every image."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([0.7, 1.0, -2.0, 0.3, 0.0]))

    def forward(self, images):
        return self.logits.expand(len(images), -1)


class LeftMinusRight(nn.Module):
    """Binary logit = mean(left half) - mean(right half), scaled: a horizontal flip negates it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(20.0))

    def forward(self, images):
        w = images.shape[3] // 2
        z = self.scale * (images[..., :w].mean(dim=(1, 2, 3)) - images[..., w:].mean(dim=(1, 2, 3)))
        return torch.stack([z, torch.zeros_like(z), torch.zeros_like(z), torch.zeros_like(z), torch.zeros_like(z)], 1)


def _images(n: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 16, 16), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _to_float(images):
    return images.float() / 255


def test_a_model_that_ignores_its_input_is_perfectly_stable():
    s = stability(Constant(), _to_float, _images(), LAYOUT, perturbations=8)
    assert s.shape == (24, 2) and np.array_equal(s, np.ones((24, 2)))


def test_a_model_that_a_flip_reverses_is_less_stable_on_both_tasks_it_moves():
    s = stability(LeftMinusRight(), _to_float, _images(), LAYOUT, perturbations=4)
    assert np.all(s[:, 1] == 1.0)  # the 4-class task's logits never move
    assert np.all(s[:, 0] < 1.0) and np.all(s[:, 0] >= 0.0)
    # the flip alone moves |p - (1 - p)| = |2p - 1|: at least that share of the mean change
    images = _images()
    with torch.no_grad():
        p = torch.sigmoid(LeftMinusRight()(_to_float(images))[:, 0]).double().numpy()
    assert np.all(1 - s[:, 0] >= np.abs(2 * p - 1) / 4 - 1e-9)


@pytest.mark.parametrize("kind", PERTURBATIONS)
def test_perturbations_keep_uint8_shape_and_are_reproducible(kind):
    images = _images(5)
    a = perturb(images, kind, torch.Generator().manual_seed(3))
    b = perturb(images, kind, torch.Generator().manual_seed(3))
    assert a.dtype == torch.uint8 and a.shape == images.shape and torch.equal(a, b)
    assert not torch.equal(a, images)


def test_occlusion_greys_a_square_of_a_quarter_side():
    images = torch.zeros(3, 3, 16, 16, dtype=torch.uint8)
    occluded = perturb(images, "occlusion", torch.Generator().manual_seed(0))
    assert ((occluded == 128).sum(dim=(1, 2, 3)) == 3 * 4 * 4).all()


def _predictions(network, images, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        flat = network(_to_float(images)).numpy() * 3  # saved logits, over-confident
    binary, multi = LAYOUT.split(flat)
    logits = [binary + rng.normal(0, 2, len(binary)), multi + rng.normal(0, 2, multi.shape)]
    return Predictions(["bin", "multi"], logits, [rng.integers(0, 2, len(images)), rng.integers(0, 4, len(images))])


def test_with_perfect_stability_the_fit_is_temperature_scaling():
    network = Constant()
    val_images, test_images = _images(200, 0), _images(100, 1)
    val, test = _predictions(network, val_images, 0), _predictions(network, test_images, 1)
    ours = stability_calibrate(network, _to_float, val_images, test_images, val, test, perturbations=4)
    ts = calibrate("ts", val, test)
    for a, b in zip(ours.logits, ts.logits):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_stability_scaling_refuses_images_that_do_not_match_the_predictions():
    network = Constant()
    val = _predictions(network, _images(10), 0)
    with pytest.raises(PosthocError, match="validation split has 9 images"):
        stability_calibrate(network, _to_float, _images(9), _images(10), val, val)
    with pytest.raises(PosthocError, match="at least one perturbation"):
        stability(network, _to_float, _images(4), LAYOUT, perturbations=0)


# ------------------------------------------------------------------ partly labelled validation and test data


class FlipMoves(nn.Module):
    """Both tasks' logits follow d = mean(left half) - mean(right half), which a horizontal flip negates; with
    the flip as the only perturbation, a sample's stability depends on its own image alone (no random draw)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(200.0))
        self.images_seen = 0

    def forward(self, images):
        self.images_seen += len(images)
        w = images.shape[3] // 2
        d = self.scale * (images[..., :w].mean(dim=(1, 2, 3)) - images[..., w:].mean(dim=(1, 2, 3)))
        return torch.stack([d, d, -d, 0.5 * d, torch.zeros_like(d)], 1)


def _sampled(network, images, seed):
    """Saved logits 3x the network's, labels drawn from the network's own probabilities: a finite optimum."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        binary, multi = LAYOUT.split(network(_to_float(images)).double().numpy())
    probs = np.exp(multi - multi.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = [(rng.random(len(images)) < 1 / (1 + np.exp(-binary))).astype(np.int64),
              (rng.random(len(images))[:, None] > np.cumsum(probs, 1)).sum(1)]
    return Predictions(["bin", "multi"], [3 * binary, 3 * multi], labels)


def _hide(predictions: Predictions, hidden: np.ndarray) -> Predictions:
    """``predictions`` with label (n, t) replaced by MISSING_LABEL where ``hidden`` (N, T) is True."""
    return Predictions(predictions.task_names, predictions.logits,
                       [np.where(hidden[:, t], MISSING_LABEL, y) for t, y in enumerate(predictions.labels)])


def _parameters(calibrator) -> np.ndarray:
    return np.stack([calibrator.log_base.detach().numpy(), calibrator.slope.detach().numpy()], 1)  # (T, 2)


def test_stability_fit_on_hidden_labels_is_each_tasks_fit_on_its_labelled_rows():
    network, images = FlipMoves(), _images(300, 0)
    val = _sampled(network, images, 0)
    rng = np.random.default_rng(3)
    nowhere = rng.random(300) < 0.2  # rows labelled in no task: not re-run at all
    hidden = nowhere[:, None] | (rng.random((300, 2)) < 0.3)  # and entries hidden task by task
    network.images_seen = 0
    fitted = _parameters(fit_stability(network, _to_float, images, _hide(val, hidden), perturbations=1))
    assert network.images_seen == 2 * int((~hidden).any(1).sum())  # clean + one flip of each labelled row
    assert np.abs(fitted[:, 1]).max() > 0.05  # the slope is used: not temperature scaling in disguise
    for t in range(2):  # task t alone on its labelled rows (the other task's true labels there: not compared)
        rows = ~hidden[:, t]
        subset = Predictions(val.task_names, [z[rows] for z in val.logits], [y[rows] for y in val.labels])
        alone = _parameters(fit_stability(network, _to_float, images[torch.from_numpy(rows)], subset,
                                          perturbations=1))
        # the same objective for task t; the two L-BFGS runs (joint, alone) stop at their tolerance, ~2e-6
        # apart here; a wrong mask (a hidden label read as class 0) moves them by 0.02 to 1.4
        np.testing.assert_allclose(fitted[t], alone[t], rtol=0, atol=2e-5)


def test_stability_fit_with_random_perturbations_skips_unlabelled_rows_exactly():
    """Rows labelled in no task are left out before the perturbations are drawn: the fit on the hidden data is
    the fit on the labelled rows with the very same perturbations (shift, noise, occlusion included)."""
    network, images = LeftMinusRight(), _images(200, 0)
    val = _predictions(network, images, 0)
    nowhere = np.random.default_rng(4).random(200) < 0.3
    rows = ~nowhere
    hidden = _parameters(fit_stability(network, _to_float, images, _hide(val, np.stack([nowhere] * 2, 1)),
                                       perturbations=4))
    subset = Predictions(val.task_names, [z[rows] for z in val.logits], [y[rows] for y in val.labels])
    labelled = _parameters(fit_stability(network, _to_float, images[torch.from_numpy(rows)], subset, perturbations=4))
    np.testing.assert_allclose(hidden, labelled, rtol=0, atol=1e-9)


def test_stability_scaled_test_predictions_are_scored_on_labelled_rows_only():
    network = FlipMoves()
    val_images, test_images = _images(200, 0), _images(120, 1)
    val, test = _predictions(network, val_images, 0), _predictions(network, test_images, 1)
    hidden = np.random.default_rng(5).random((120, 2)) < 0.4
    masked = stability_calibrate(network, _to_float, val_images, test_images, val, _hide(test, hidden),
                                 perturbations=2)
    full = stability_calibrate(network, _to_float, val_images, test_images, val, test, perturbations=2)
    for a, b in zip(masked.logits, full.logits):  # every row is rescaled, labelled or not
        np.testing.assert_array_equal(a, b)
    scored = score(masked, [15], pairs=0)
    for t, name in enumerate(masked.task_names):
        rows = ~hidden[:, t]
        assert scored["tasks"][name] == pytest.approx(task_metrics(full.logits[t][rows], full.labels[t][rows], [15]),
                                                      rel=1e-12, nan_ok=True)


@pytest.mark.parametrize("method", ["stability", "ts"])
def test_a_task_with_no_labelled_validation_sample_is_refused(method):
    network, images = Constant(), _images(20)
    val = _predictions(network, images, 0)
    hidden = np.zeros((20, 2), dtype=bool)
    hidden[:, 1] = True
    with pytest.raises(PosthocError, match=r"post-hoc '\w+': the validation predictions' task 'multi' has no "
                                           "labelled sample"):
        calibrate(method, _hide(val, hidden), val, network, _to_float, images, images)
    if method == "stability":
        with pytest.raises(PosthocError, match="stability scaling: the validation predictions' task 'multi'"):
            stability_calibrate(network, _to_float, images, images, _hide(val, hidden), val)
