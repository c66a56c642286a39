"""Corrupted test splits: identity at severity 0, reproducible per seed, cached once, official CIFAR-C files."""

from __future__ import annotations

import numpy as np
import pytest

import tasks  # noqa: F401  (registers the data sets)
from mtl_cog.config import DataConfig
from mtl_cog.constants import CORRUPTIONS
from mtl_cog.data import shift
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import ConfigError, DataError
from tasks.fixtures import write_cifar10, write_cifar_c


def _images(n=6, size=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 3, size, size), dtype=np.uint8)


def test_severity_zero_changes_nothing():
    images = _images()
    for name in ("gaussian_noise", "fog"):
        assert np.array_equal(shift.corrupt_images(images, name, 0, seed=0), images)


@pytest.mark.parametrize("name", ["gaussian_noise", "impulse_noise", "zoom_blur", "contrast"])
def test_reproducible_per_seed_and_independent_of_blocks(name):
    images = _images()
    first = shift.corrupt_images(images, name, 3, seed=7)
    assert np.array_equal(first, shift.corrupt_images(images, name, 3, seed=7))
    assert first.shape == images.shape and first.dtype == np.uint8 and not np.array_equal(first, images)
    # image i depends on its index, not on the block it was corrupted in
    assert np.array_equal(first[2:5], shift.corrupt_images(images[2:5], name, 3, seed=7, first_index=2))
    if name in ("gaussian_noise", "impulse_noise"):  # random corruptions differ for another seed
        assert not np.array_equal(first, shift.corrupt_images(images, name, 3, seed=8))


@pytest.mark.slow  # ~12 s: numba compiles glass_blur, frost reads its images
def test_every_corruption_and_small_images():
    images = _images(n=2, size=28)  # smaller than the package's 32 px: padded, corrupted, cropped back
    for name in CORRUPTIONS:
        out = shift.corrupt_images(images, name, 5, seed=0)
        assert out.shape == images.shape and out.dtype == np.uint8, name


def test_bad_names_and_severities():
    with pytest.raises(ConfigError, match="unknown corruption"):
        shift.corrupt_images(_images(), "gausian_noise", 1, seed=0)
    with pytest.raises(ConfigError, match="1..5"):
        shift.corrupt_images(_images(), "fog", 6, seed=0)


def _cifar(tmp_path, n_test=12):
    write_cifar10(tmp_path, n_train_per_batch=4, n_test=n_test)
    cfg = DataConfig(task="cifar10", root=str(tmp_path), image_size=32)
    data = load_task(cfg)
    return cfg, data, TASKS.get("cifar10")


def test_corrupted_split_is_built_once_and_reused(tmp_path, monkeypatch):
    cfg, data, task = _cifar(tmp_path)
    clean = data.splits["test"]
    built = shift.corrupted_split(task, data.spec, cfg, clean, "shot_noise", 2, seed=0, workers=1)
    expected = shift.corrupt_images(clean.images.numpy(), "shot_noise", 2, seed=0)
    assert np.array_equal(built.images.numpy(), expected)
    assert np.array_equal(built.labels.numpy(), clean.labels.numpy())
    calls = []
    monkeypatch.setattr(shift, "corrupt_images", lambda *a, **k: calls.append(a))  # a rebuild would call it
    again = shift.corrupted_split(task, data.spec, cfg, clean, "shot_noise", 2, seed=0, workers=1)
    assert not calls and np.array_equal(again.images.numpy(), expected)
    assert shift.corrupted_split(task, data.spec, cfg, clean, "shot_noise", 0, seed=0) is clean


def test_official_cifar_c_files_are_read_instead(tmp_path, monkeypatch):
    cfg, data, task = _cifar(tmp_path)
    write_cifar_c(tmp_path, ("fog",))
    clean = data.splits["test"]
    monkeypatch.setattr(shift, "corrupt_images", lambda *a, **k: pytest.fail("corrupted instead of reading"))
    split = shift.corrupted_split(task, data.spec, cfg, clean, "fog", 4, seed=0)
    official = np.clip(clean.images.numpy().astype(int) + 80, 0, 255)  # the fixture's severity 4: +20*4
    assert np.array_equal(split.images.numpy(), official)


def test_official_file_of_the_wrong_shape_is_one_error(tmp_path):
    cfg, data, task = _cifar(tmp_path)
    folder = write_cifar_c(tmp_path, ("fog",))
    np.save(folder / "fog.npy", np.zeros((50, 32, 32, 3), np.uint8))
    with pytest.raises(DataError, match=r"expected uint8 of shape \(60, 32, 32, 3\)"):
        shift.corrupted_split(task, data.spec, cfg, data.splits["test"], "fog", 1, seed=0)
    write_cifar_c(tmp_path, ("fog",))
    labels = np.load(folder / "labels.npy")
    np.save(folder / "labels.npy", (labels + 1) % 10)
    with pytest.raises(DataError, match="differ from the test split"):
        shift.corrupted_split(task, data.spec, cfg, data.splits["test"], "fog", 1, seed=0)
