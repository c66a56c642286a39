"""Damaged real-data files and sizes no machine holds end in one error line, before anything large is allocated."""

from __future__ import annotations

import gzip
import struct
import time
import tracemalloc

import numpy as np
import pytest
from test_fashion import _hostile, cfg, mosaic_cfg

from mtl_cog.config import FashionMosaicConfig
from mtl_cog.data.loading import load_task
from mtl_cog.errors import ConfigError, DataError
from tasks import fashion_mnist
from tasks.fixtures import write_fashion_mnist, write_idx


def _damaged_deflate(path) -> None:
    data = bytearray(path.read_bytes())
    data[12:40] = b"\xff" * 28  # inside the deflate stream, after gzip's 10-byte header
    path.write_bytes(bytes(data))


def _bomb(path) -> None:
    """A valid gzip whose IDX header announces 10 images but which inflates to 64 MiB."""
    with gzip.open(path, "wb") as handle:
        handle.write(struct.pack(">4I", fashion_mnist.IMAGE_MAGIC, 10, 28, 28))
        zeros = bytes(1 << 20)
        for _ in range(64):
            handle.write(zeros)


def _announces_too_much(path) -> None:
    with gzip.open(path, "wb") as handle:
        handle.write(struct.pack(">4I", fashion_mnist.IMAGE_MAGIC, 2**32 - 1, 28, 28) + bytes(100))


@pytest.mark.parametrize("damage, expected", [
    (_damaged_deflate, "cannot read"),
    (_bomb, "trailing bytes"),
    (_announces_too_much, "more than the"),
])
def test_a_damaged_gzip_is_refused_within_its_announced_length(tmp_path, damage, expected):
    path, data_cfg = _hostile(tmp_path, "t10k-images-idx3-ubyte.gz", damage)
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        load_task(data_cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    message = str(info.value)
    assert expected in message and str(path) in message and "\n" not in message, message
    assert peak < 32 * 2**20, f"{peak / 2**20:.0f} MiB held while refusing"  # not the 64 MiB it inflates to
    assert time.perf_counter() - start < 10


def test_the_plain_file_is_bounded_by_its_header_too(tmp_path):
    path, data_cfg = _hostile(tmp_path, "train-labels-idx1-ubyte", lambda p: p.write_bytes(
        struct.pack(">2I", fashion_mnist.LABEL_MAGIC, 20) + bytes(20 + 4096)))
    with pytest.raises(DataError, match="trailing bytes"):
        load_task(data_cfg)


def test_a_mosaic_larger_than_memory_is_refused_before_anything_is_read(tmp_path):
    sizes = FashionMosaicConfig(train_size=10**12, val_size=12, test_size=16)
    data_cfg = cfg(tmp_path / "nothing_here", "fashion_mosaic", image_size=32, fashion_mosaic=sizes,
                   cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"data.fashion_mosaic: 1,000,000,000,028 samples .* Choose smaller sizes"):
        load_task(data_cfg)


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_mosaic_whose_source_pool_is_empty_is_refused(tmp_path, split):
    sizes = {"n_train": 60, "n_test": 30, f"n_{split}": 0}
    fx = write_fashion_mnist(tmp_path / "root", **sizes)
    with pytest.raises(DataError, match="source pool of the .*split holds no Fashion-MNIST item") as info:
        load_task(mosaic_cfg(tmp_path / "root", cache_dir=str(tmp_path / "cache")))
    assert str(fx.folder) in str(info.value)


def test_write_idx_round_trips(tmp_path):  # the fixture the cases above damage
    values = np.arange(20, dtype=np.uint8)
    write_idx(tmp_path / "x", values)
    assert (fashion_mnist.read_idx(tmp_path / "x", fashion_mnist.LABEL_MAGIC, ()) == values).all()
