"""The decode-once cache: same data as a direct read, reused, rebuilt when stale, written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tasks  # noqa: F401  (registers every task)
from mtl_cog.config import DataConfig, SyntheticConfig
from mtl_cog.data import cache
from mtl_cog.data.cache import cache_dir, load_cached
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import CacheError
from tasks.fixtures import write_celeba

REPO = Path(__file__).resolve().parents[1]


class CountingTask:
    """Wraps a registered task and counts how often it really decodes."""

    def __init__(self, name: str) -> None:
        self.inner = TASKS.get(name)
        self.loads = 0

    def source_files(self, data_cfg):
        return self.inner.source_files(data_cfg)

    def load(self, data_cfg):
        self.loads += 1
        return self.inner.load(data_cfg)


def celeba_cfg(root, **kw) -> DataConfig:
    return DataConfig(task="celeba", root=str(root), image_size=kw.pop("image_size", 16), **kw)


def assert_same(a, b) -> None:
    assert a.spec == b.spec
    for name in ("train", "val", "test"):
        x, y = a.splits[name], b.splits[name]
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)
        assert (x.true_probs is None) == (y.true_probs is None)
        if x.true_probs is not None:
            assert np.array_equal(np.asarray(x.true_probs), np.asarray(y.true_probs))


def test_celeba_cache_equals_direct_read_and_is_reused(tmp_path):
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    first = load_cached(task, cfg, show_progress=False)
    second = load_cached(task, cfg, show_progress=False)
    assert task.loads == 1  # decoded once
    assert_same(first, TASKS.get("celeba").load(cfg))
    assert_same(second, first)
    folder = cache_dir(cfg)
    assert folder.parent == tmp_path / ".mtl_cog_cache"
    images = np.load(folder / "train.images.npy", mmap_mode="r")
    assert images.dtype == np.uint8 and images.shape == (12, 3, 16, 16)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp/stale leftovers


def test_synthetic_keeps_true_probs_and_every_option_has_its_own_cache(tmp_path):
    base = DataConfig(task="synthetic", root=str(tmp_path), synthetic=SyntheticConfig(
        num_attributes=3, train_size=20, val_size=10, test_size=10))
    data = load_task(base)
    assert data.splits["test"].true_probs is not None
    assert_same(data, TASKS.get("synthetic").load(base))
    other_seed = DataConfig(task="synthetic", root=str(tmp_path), synthetic=SyntheticConfig(
        num_attributes=3, train_size=20, val_size=10, test_size=10, seed=7))
    smaller = DataConfig(task="synthetic", root=str(tmp_path), image_size=16, synthetic=base.synthetic)
    capped = DataConfig(task="synthetic", root=str(tmp_path), max_samples=5, synthetic=base.synthetic)
    folders = {cache_dir(c) for c in (base, other_seed, smaller, capped)}
    assert len(folders) == 4
    assert not torch.equal(load_task(other_seed).splits["train"].images, data.splits["train"].images)
    assert load_task(smaller).splits["train"].images.shape[-1] == 16
    assert len(load_task(capped).splits["train"]) == 5


def test_changed_source_file_rebuilds(tmp_path):
    fx = write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    before = load_cached(task, cfg, show_progress=False)
    # flip one attribute of the first image: same file, new size and mtime
    text = fx.attr_file.read_text().splitlines()
    row = text[2].split()
    row[1] = "1" if row[1] == "-1" else "-1"
    text[2] = "  ".join(row)
    fx.attr_file.write_text("\n".join(text) + "\n")
    stat = fx.attr_file.stat()
    os.utime(fx.attr_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    after = load_cached(task, cfg, show_progress=False)
    assert task.loads == 2
    first = fx.split_names["train"][0]
    assert first == fx.names[0]
    assert after.splits["train"].labels[0, 0] != before.splits["train"].labels[0, 0]
    assert_same(after, TASKS.get("celeba").load(cfg))


def test_changed_reader_code_rebuilds(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    load_cached(task, cfg, show_progress=False)
    monkeypatch.setattr(cache, "_reader_digest", lambda task: "a different reader")
    load_cached(task, cfg, show_progress=False)
    assert task.loads == 2


def test_crash_while_writing_leaves_nothing_and_next_run_builds(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(cache, "_fsync_folder", crash)
    with pytest.raises(KeyboardInterrupt):
        load_cached(task, cfg, show_progress=False)
    root = tmp_path / ".mtl_cog_cache"
    assert list(root.iterdir()) == []  # neither a half cache nor a temp folder
    monkeypatch.undo()
    assert_same(load_cached(task, cfg, show_progress=False), TASKS.get("celeba").load(cfg))


@pytest.mark.parametrize("damage", ["delete_array", "truncate_meta", "wrong_shape"])
def test_damaged_cache_is_rebuilt(tmp_path, damage):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    load_cached(task, cfg, show_progress=False)
    folder = cache_dir(cfg)
    if damage == "delete_array":
        (folder / "val.images.npy").unlink()
    elif damage == "truncate_meta":
        (folder / "meta.json").write_text('{"format": 1, "fingerp')
    else:
        meta = json.loads((folder / "meta.json").read_text())
        meta["splits"]["train"]["images"][0] += 1
        (folder / "meta.json").write_text(json.dumps(meta))
    assert_same(load_cached(task, cfg, show_progress=False), TASKS.get("celeba").load(cfg))
    assert task.loads == 2


def test_use_cache_false_writes_nothing(tmp_path):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path, use_cache=False)
    load_task(cfg)
    assert not (tmp_path / ".mtl_cog_cache").exists()


def test_unwritable_cache_dir_names_it(tmp_path):
    write_celeba(tmp_path, n=10)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = celeba_cfg(tmp_path, cache_dir=str(blocker / "cache"))
    with pytest.raises(CacheError, match="a_file"):
        load_task(cfg)


def test_prepare_data_script_builds_then_reuses(tmp_path):
    write_celeba(tmp_path, n=10)
    command = [sys.executable, str(REPO / "scripts" / "prepare_data.py"), "--task", "celeba", "--data-root",
               str(tmp_path), "--image-size", "16", "--cache-dir", str(tmp_path / "c")]
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "first use" in first.stderr
    folder = Path(first.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "c" and (folder / "meta.json").is_file()
    second = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert second.returncode == 0 and "building" not in second.stderr
    assert second.stdout.strip().splitlines()[-1] == str(folder)
    bad = subprocess.run([*command[:5], str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "CelebA not found" in bad.stderr and "Traceback" not in bad.stderr
