"""The cifar10c suite: CIFAR-10-C's published severity parameters, checked by how far they move pixels.

For every corruption whose pixel change has a closed form, the RMS change of our pictures at each
severity is compared with the one the published parameter implies (computed here from the formula
of the corruption, not written down): Gaussian noise c -> 255 c, shot noise c -> 255 sqrt(x / c),
impulse noise c -> 255 sqrt(c ((x)^2 + (1 - x)^2) / 2), contrast c -> (1 - c) std, brightness c ->
255 c on grey pictures. The script's truncation to uint8 adds about half a level of bias, within
the tolerance. The other corruptions (all but glass blur, elastic and frost) are checked for order:
at 32 px each of CIFAR-10-C's severities moves pixels no more than ImageNet-C's same severity.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtl_cog.constants import CORRUPTIONS, SEVERITIES
from mtl_cog.data import cifar_c
from mtl_cog.data.shift import corrupt
from mtl_cog.errors import ConfigError

GREY = 0.5  # a mid-grey picture: no clipping for the noises at CIFAR-10-C's parameters


def _rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def _grey(n=16, side=32, level=GREY):
    return np.full((n, side, side, 3), round(level * 255), dtype=np.uint8)


EXPECTED_RMS = {
    "gaussian_noise": lambda c, x: 255 * c,
    "shot_noise": lambda c, x: 255 * math.sqrt(x / c),
    "impulse_noise": lambda c, x: 255 * math.sqrt(c * (x**2 + (1 - x) ** 2) / 2),
    "brightness": lambda c, x: 255 * c,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_RMS))
def test_pixel_change_of_the_noises_and_brightness_is_the_published_parameters(name):
    pictures = _grey()
    x = pictures[0, 0, 0, 0] / 255
    for severity in SEVERITIES:
        c = cifar_c.PARAMETERS[name][severity - 1]
        got = _rms(corrupt(pictures, name, severity, suite="cifar10c"), pictures)
        assert got == pytest.approx(EXPECTED_RMS[name](c, x), rel=0.06, abs=0.8), (name, severity)


def test_severity_one_gaussian_noise_is_cifar10c_not_imagenetc():
    pictures = _grey()
    cifar = _rms(corrupt(pictures, "gaussian_noise", 1, suite="cifar10c"), pictures)
    imagenet = _rms(corrupt(pictures, "gaussian_noise", 1, suite="imagenetc"), pictures)
    assert cifar == pytest.approx(255 * 0.04, rel=0.06)  # make_cifar_c.py: c = 0.04
    assert imagenet == pytest.approx(255 * 0.08, rel=0.06)  # ImageNet-C: c = 0.08


def test_pixel_change_of_contrast_is_the_published_parameters():
    rng = np.random.default_rng(0)
    pictures = rng.integers(60, 196, (8, 32, 32, 3), dtype=np.uint8)  # contracting to the mean never clips
    spread = np.sqrt(np.mean((pictures - pictures.mean(axis=(1, 2), keepdims=True)) ** 2))
    for severity in SEVERITIES:
        c = cifar_c.PARAMETERS["contrast"][severity - 1]
        got = _rms(corrupt(pictures, "contrast", severity, suite="cifar10c"), pictures)
        assert got == pytest.approx((1 - c) * spread, rel=0.03, abs=0.6), severity


def test_cifar10c_moves_pixels_no_more_than_imagenetc_at_each_severity():
    rng = np.random.default_rng(1)
    pictures = rng.normal(128, 40, (6, 32, 32, 3)).clip(0, 255).astype(np.uint8)
    # glass blur (CIFAR's sigma 0.05 keeps the shuffled pixels sharp), elastic (a larger affine at 32 px) and
    # frost (another crop of the frost pictures) are not milder pixel by pixel: their parameters differ in kind
    for name in (n for n in CORRUPTIONS if n not in ("glass_blur", "elastic_transform", "frost")):
        for severity in SEVERITIES:
            cifar = _rms(corrupt(pictures, name, severity, suite="cifar10c", seed=3), pictures)
            imagenet = _rms(corrupt(pictures, name, severity, suite="imagenetc", seed=3), pictures)
            assert cifar <= imagenet * 1.25 + 1.0, (name, severity, cifar, imagenet)


def test_motion_kernel_is_imagemagicks():
    weights, offsets = cifar_c.motion_kernel(6, 1.5, 0.0)
    assert len(weights) == 13 and weights.sum() == pytest.approx(1.0)  # width 2 ceil(radius) + 1
    assert np.allclose(weights, np.exp(-np.arange(13) ** 2 / (2 * 1.5**2)) / np.exp(-np.arange(13) ** 2 / 4.5).sum())
    assert offsets.tolist() == [[0, i] for i in range(13)]  # angle 0: along the row, one pixel per step
    _, diagonal = cifar_c.motion_kernel(2, 1.0, 45.0)
    assert diagonal.tolist() == [[0, 0], [1, 1], [1, 1], [2, 2], [3, 3]]  # ceil(i sin 45° - 0.5), i = 0..4


def test_corrupt_takes_and_returns_pictures():
    pictures = np.random.default_rng(2).integers(0, 256, (3, 28, 28, 3), dtype=np.uint8)
    out = corrupt(pictures, "zoom_blur", 2)
    assert out.shape == pictures.shape and out.dtype == np.uint8 and not np.array_equal(out, pictures)
    assert np.array_equal(out, corrupt(pictures, "zoom_blur", 2, seed=0))
    assert np.array_equal(corrupt(pictures, "fog", 3, suite="auto"), corrupt(pictures, "fog", 3, suite="cifar10c"))
    with pytest.raises(ConfigError, match="uint8"):
        corrupt(pictures.astype(np.float32), "fog", 1)
    with pytest.raises(ConfigError, match="suite"):
        corrupt(pictures, "fog", 1, suite="cifar100c")
