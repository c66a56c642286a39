"""Stability scaling: perturbations, the stability score's known answers, and the fit on validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.stability import PERTURBATIONS, perturb, stability, stability_calibrate

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
