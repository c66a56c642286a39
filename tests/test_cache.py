"""The decode-once cache: same data as a direct read, one cache for every cap, checksummed, locked,
written atomically, and every failure (damage, full disk, file-size limit, killed builder, read-only
folder, hostile image) ends in one clear error or a rebuild, never in silently wrong data.

It stays one file over 450 lines because its cases share one set of fixtures (a counting task, the
leftover check, CelebA files written in the official format) and are read as one list of the
cache's promises, in the order of ``mtl_cog/data/cache.py``'s docstring.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from mtl_cog import io as mtl_io
from mtl_cog import locks
from mtl_cog.benchmarks import cache_build
from mtl_cog.cli import prepare_data
from mtl_cog.cli import train as train_cli
from mtl_cog.config import DataConfig, SyntheticConfig
from mtl_cog.data import cache, cache_writer, task_api
from mtl_cog.data.cache import cache_dir, file_checksum, inspect_cache, load_cached
from mtl_cog.data.cache_writer import META_CHECKSUM, meta_checksum
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS, TaskData
from mtl_cog.errors import CacheError, DataError, run_cli
from tasks.fixtures import write_bomb_jpeg, write_celeba

REPO = Path(__file__).resolve().parents[1]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}


class CountingTask:
    """Wraps a registered task and counts how often it really decodes (opens its sources)."""

    def __init__(self, name: str) -> None:
        self.inner = TASKS.get(name)
        self.opens = 0

    def source_files(self, data_cfg):
        return self.inner.source_files(data_cfg)

    def open(self, data_cfg):
        self.opens += 1
        return self.inner.open(data_cfg)


def celeba_cfg(root, **kw) -> DataConfig:
    return DataConfig(task="celeba", root=str(root), image_size=kw.pop("image_size", 16), **kw)


def direct(task: str, data_cfg: DataConfig) -> TaskData:
    return TASKS.get(task).open(data_cfg).decode(data_cfg.max_samples)


def assert_same(a, b) -> None:
    assert a.spec == b.spec
    for name in ("train", "val", "test"):
        x, y = a.splits[name], b.splits[name]
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)
        assert (x.true_probs is None) == (y.true_probs is None)
        if x.true_probs is not None:
            assert np.array_equal(np.asarray(x.true_probs), np.asarray(y.true_probs))


def leftovers(root: Path) -> list[str]:
    """Temporary or stale folders of builders: a finished or failed build must leave none."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".stale-"))) if root.exists() else []


def overwrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Change bytes of a file without changing its size (what a bad disk or a stray write does)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


# --------------------------------------------------------------------------------- same data, reused


def test_celeba_cache_equals_direct_read_and_is_reused(tmp_path):
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    first = load_cached(task, cfg, show_progress=False)
    second = load_cached(task, cfg, show_progress=False)
    assert task.opens == 1  # decoded once
    assert_same(first, direct("celeba", cfg))
    assert_same(second, first)
    folder = cache_dir(cfg)
    assert folder.parent == tmp_path / ".mtl_cog_cache"
    images = np.load(folder / "train.images.npy", mmap_mode="r")
    assert images.dtype == np.uint8 and images.shape == (12, 3, 16, 16)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["files"]["train.images.npy"]["xxh3_128"] == file_checksum(folder / "train.images.npy")
    assert leftovers(folder.parent) == []


def test_max_samples_is_a_slice_of_the_one_full_cache(tmp_path):
    write_celeba(tmp_path, n=20)
    full_cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    full = load_cached(task, full_cfg, show_progress=False)
    for cap in (1, 3, 100):
        capped_cfg = celeba_cfg(tmp_path, max_samples=cap)
        assert cache_dir(capped_cfg) == cache_dir(full_cfg)
        capped = load_task(capped_cfg)
        for name, split in capped.splits.items():
            assert len(split) == min(cap, len(full.splits[name]))
            assert torch.equal(split.images, full.splits[name].images[:cap])
            assert torch.equal(split.labels, full.splits[name].labels[:cap])
        assert_same(capped.head(None), direct("celeba", capped_cfg))  # = decoding only the first N
    assert task.opens == 1  # no rebuild for any cap
    assert [p.name for p in (tmp_path / ".mtl_cog_cache").iterdir() if p.is_dir()] == [cache_dir(full_cfg).name]


def test_synthetic_keeps_true_probs_and_every_option_has_its_own_cache(tmp_path):
    base = DataConfig(task="synthetic", root=str(tmp_path), synthetic=SyntheticConfig(
        num_attributes=3, train_size=20, val_size=10, test_size=10))
    data = load_task(base)
    assert data.splits["test"].true_probs is not None
    assert_same(data, direct("synthetic", base))
    other_seed = dataclasses.replace(base, synthetic=dataclasses.replace(base.synthetic, seed=7))
    smaller = dataclasses.replace(base, image_size=16)
    capped = dataclasses.replace(base, max_samples=5)
    assert len({cache_dir(c) for c in (base, other_seed, smaller)}) == 3
    assert cache_dir(capped) == cache_dir(base)
    assert not torch.equal(load_task(other_seed).splits["train"].images, data.splits["train"].images)
    assert load_task(smaller).splits["train"].images.shape[-1] == 16
    assert torch.equal(load_task(capped).splits["train"].images, data.splits["train"].images[:5])


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_built_in_tasks_cache_equals_direct_read(tmp_path, name):
    cfg = DataConfig(task=name, root=str(tmp_path), image_size=16,
                     synthetic=SyntheticConfig(num_attributes=4, train_size=30, val_size=20, test_size=20))
    assert_same(load_task(cfg), direct(name, cfg))


def test_empty_split_is_cached_and_then_refused_by_load_task(tmp_path):
    cfg = DataConfig(task="synthetic", root=str(tmp_path), image_size=8)
    source = TASKS.get("synthetic").open(cfg)
    empty = dataclasses.replace(source.splits["val"], labels=source.splits["val"].labels[:0], true_probs=None)
    source.splits["val"] = empty
    cache.write_source(tmp_path / "c", source, {"test": 1}, show_progress=False)
    data, problem = inspect_cache(tmp_path / "c", None)
    assert problem == "" and len(data.splits["val"]) == 0 and data.splits["val"].images.shape == (0, 3, 8, 8)


# ----------------------------------------------------------------------------------------- stale


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
    assert task.opens == 2
    assert fx.split_names["train"][0] == fx.names[0]
    assert after.splits["train"].labels[0, 0] != before.splits["train"].labels[0, 0]
    assert_same(after, direct("celeba", cfg))


def test_changed_reader_code_rebuilds(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    load_cached(task, cfg, show_progress=False)
    monkeypatch.setattr(cache, "_reader_digest", lambda task: "a different reader")
    load_cached(task, cfg, show_progress=False)
    assert task.opens == 2


def test_old_format_cache_is_ignored_and_named(tmp_path, capsys):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    old = tmp_path / ".mtl_cog_cache" / "celeba-16px-5-0123456789ab"  # format 1: one folder per max_samples
    old.mkdir(parents=True)
    (old / "meta.json").write_text(json.dumps({"format": 1, "splits": {}}))
    assert_same(load_cached(CountingTask("celeba"), cfg), direct("celeba", cfg))
    err = capsys.readouterr().err
    assert "older format" in err and str(old) in err
    assert old.exists()  # never deleted behind the user's back


# ---------------------------------------------------------------------------------------- damage


def damage_zero_images(folder: Path) -> None:
    path = folder / "train.images.npy"
    overwrite_in_place(path, path.stat().st_size - 3 * 16 * 16 * 4, bytes(3 * 16 * 16 * 4))  # last 4 images


def damage_labels(folder: Path) -> None:
    labels = np.load(folder / "train.labels.npy")
    labels[0, 0], labels[1, 3] = 5, -3
    np.save(folder / "train.labels.npy", labels)  # same size, new content


DAMAGE = {
    "zeroed images, same size": (damage_zero_images, "train.images.npy does not match its checksum"),
    "labels 5 and -3, same size": (damage_labels, "train.labels.npy does not match its checksum"),
    "truncated images": (lambda f: os.truncate(f / "val.images.npy", 100), "val.images.npy has 100 bytes"),
    "deleted array": (lambda f: (f / "val.images.npy").unlink(), "val.images.npy is missing"),
    "truncated meta": (lambda f: (f / "meta.json").write_text('{"format": 2, "fingerp'), "meta.json is unreadable"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_cache_is_reported_and_rebuilt(tmp_path, case, capsys):
    damage, reason = DAMAGE[case]
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")
    load_cached(task, cfg, show_progress=False)
    damage(cache_dir(cfg))
    rebuilt = load_cached(task, cfg)
    assert task.opens == 2
    assert_same(rebuilt, direct("celeba", cfg))
    err = capsys.readouterr().err
    assert "damaged" in err and reason in err and str(cache_dir(cfg)) in err


def test_labels_out_of_range_under_a_matching_checksum_are_refused(tmp_path):
    """A cache whose checksums were recomputed after its labels changed still fails the range check."""
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    load_cached(CountingTask("celeba"), cfg, show_progress=False)
    folder = cache_dir(cfg)
    damage_labels(folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["train.labels.npy"]["xxh3_128"] = file_checksum(folder / "train.labels.npy")
    meta[META_CHECKSUM] = meta_checksum(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    data, problem = inspect_cache(folder, None)
    assert data is None
    assert problem.startswith("damaged") and "train.labels.npy" in problem and "label 5 at row 0" in problem
    assert "0..1" in problem


@pytest.mark.parametrize("edit, reason", [
    (lambda m: m["spec"]["mean"].__setitem__(0, m["spec"]["mean"][0] + 0.1), "its own checksum"),
    (lambda m: m["spec"]["task_names"].reverse(), "its own checksum"),
    (lambda m: m.pop(META_CHECKSUM), "stale: written before meta.json was checksummed"),
])
def test_meta_json_is_covered_by_its_own_checksum(tmp_path, edit, reason):
    """One changed value of meta.json (the normalisation mean, the order of the task names) flows into
    training and task_spec.json; the cache's file checksums sit in meta.json and did not cover it."""
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    load_cached(CountingTask("celeba"), cfg, show_progress=False)
    folder = cache_dir(cfg)
    assert inspect_cache(folder, None)[1] == ""
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    data, problem = inspect_cache(folder, None)
    assert data is None and reason in problem


def truncate_an_image(fx) -> Path:
    """Damage one source JPEG in place: the folder's fingerprint (names, sizes, mtimes of the lists) stays."""
    path = fx.image_dir / fx.split_names["train"][2]
    overwrite_in_place(path, 200, bytes(path.stat().st_size - 200))
    return path


def test_damaged_cache_that_cannot_be_rebuilt_is_refused_naming_both(tmp_path):
    fx = write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    load_task(cfg)
    damage_zero_images(cache_dir(cfg))
    bad_source = truncate_an_image(fx)
    with pytest.raises(DataError) as info:
        load_task(cfg)
    message = str(info.value)
    assert str(cache_dir(cfg)) in message and "damaged" in message and "checksum" in message
    assert str(bad_source) in message


def test_training_on_a_damaged_cache_rebuilds_or_stops(tmp_path, capsys, fresh_accelerate_state):
    """The issue's case end to end: the run notices, and without sources it stops with one error line."""
    fx = write_celeba(tmp_path / "data", n=20, image_size=(40, 48))
    argv = [f"output_dir={tmp_path / 'runs'}", "tracking=none", "train.epochs=1", "train.batch_size=8",
            "model.backbone=cog_cnn_tiny", "data.task=celeba", f"data.root={tmp_path / 'data'}",
            "data.image_size=16"]
    cfg = celeba_cfg(tmp_path / "data")
    load_task(cfg)
    damage_zero_images(cache_dir(cfg))
    truncate_an_image(fx)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: train_cli.main([*argv, "run_name=damaged"]))
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    error = err[err.rfind("error: "):]
    assert "damaged" in error and str(cache_dir(cfg)) in error
    assert not (tmp_path / "runs" / "damaged" / "DONE").exists()


# ------------------------------------------------------------------------------ writes that fail


def test_crash_while_writing_leaves_nothing_and_next_run_builds(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    task = CountingTask("celeba")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(mtl_io, "fsync_files", crash)
    with pytest.raises(KeyboardInterrupt):
        load_cached(task, cfg, show_progress=False)
    root = tmp_path / ".mtl_cog_cache"
    assert [p for p in root.iterdir() if p.is_dir()] == []  # neither a half cache nor a temp folder
    monkeypatch.undo()
    assert_same(load_cached(task, cfg, show_progress=False), direct("celeba", cfg))


KILL_MID_BUILD = textwrap.dedent("""
    import os, signal, sys
    import tasks
    from mtl_cog.config import DataConfig
    from mtl_cog.data import cache
    from mtl_cog.data.loading import load_task
    import mtl_cog.io
    mtl_cog.io.fsync_files = lambda folder: os.kill(os.getpid(), signal.SIGKILL)  # all written, not yet published
    load_task(DataConfig(task="celeba", root=sys.argv[1], image_size=16))
""")


def test_builder_killed_mid_build_leaves_no_trusted_cache_and_is_cleaned_up(tmp_path):
    write_celeba(tmp_path, n=20)
    killed = subprocess.run([sys.executable, "-c", KILL_MID_BUILD, str(tmp_path)], env=CHILD_ENV,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    root = tmp_path / ".mtl_cog_cache"
    assert len(leftovers(root)) == 1 and not cache_dir(celeba_cfg(tmp_path)).exists()
    task = CountingTask("celeba")
    assert_same(load_cached(task, celeba_cfg(tmp_path), show_progress=False), direct("celeba", celeba_cfg(tmp_path)))
    assert task.opens == 1 and leftovers(root) == []  # the lock died with its holder; the orphan is gone


def test_full_disk_is_one_error_naming_folder_and_space(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache_writer.os, "posix_fallocate", no_space)
    task = CountingTask("celeba")
    with pytest.raises(CacheError) as info:
        load_cached(task, cfg, show_progress=False)
    message = str(info.value)
    assert str(cache_dir(cfg)) in message and "No space left" in message and "data.cache_dir" in message
    assert re.search(r"it needs \d+\.\d+ MiB \(\d+\.\d+ [MG]iB free\)", message), message
    assert leftovers(tmp_path / ".mtl_cog_cache") == [] and not cache_dir(cfg).exists()


class FillingFile:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written (a disk filling up)."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.handle.write(data)

    def close(self) -> None:
        self.handle.close()


def test_disk_filling_up_without_preallocation_is_a_clean_error(tmp_path, monkeypatch):
    """Where the file system cannot reserve space, a full disk surfaces as a write error, not SIGBUS."""
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(cache_writer.os, "posix_fallocate", unsupported)
    monkeypatch.setattr(cache_writer, "open", lambda path, mode: FillingFile(open(path, mode), room=2000),
                        raising=False)
    with pytest.raises(CacheError, match="No space left on device") as info:
        load_cached(CountingTask("celeba"), cfg, show_progress=False)
    assert str(cache_dir(cfg)) in str(info.value)
    assert leftovers(tmp_path / ".mtl_cog_cache") == [] and not cache_dir(cfg).exists()


def test_file_size_limit_ends_with_one_error_line(tmp_path):
    """A real RLIMIT_FSIZE in the child: the kernel refuses the cache files (EFBIG), exit 2, no traceback."""
    write_celeba(tmp_path, n=20)
    command = [sys.executable, str(REPO / "scripts" / "prepare_data.py"), "--task", "celeba", "--data-root",
               str(tmp_path), "--image-size", "64", "--cache-dir", str(tmp_path / "c")]

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # train images need 144 KiB

    done = subprocess.run(command, capture_output=True, text=True, env=CHILD_ENV, timeout=120,
                          preexec_fn=limit_file_size)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    error = done.stderr[done.stderr.rfind("error: "):].strip()
    assert error.count("\n") == 0 and "File too large" in error and "file-size limit" in error
    assert str(tmp_path / "c") in error
    assert leftovers(tmp_path / "c") == [] and [p for p in (tmp_path / "c").iterdir() if p.is_dir()] == []


def test_unwritable_cache_dir_names_it(tmp_path):
    write_celeba(tmp_path, n=10)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = celeba_cfg(tmp_path, cache_dir=str(blocker / "cache"))
    with pytest.raises(CacheError, match="a_file") as info:
        load_task(cfg)
    assert "data.use_cache=false" in str(info.value)


def test_valid_cache_is_read_without_lock_or_writes(tmp_path, monkeypatch):
    """What a read-only shared folder needs: reading a valid cache neither locks nor writes."""
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path)
    load_task(cfg)
    root = tmp_path / ".mtl_cog_cache"
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}

    def no_lock(*args, **kwargs):
        raise AssertionError("a valid cache was locked")

    monkeypatch.setattr(cache, "_build_lock", no_lock)
    for path in root.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    root.chmod(0o555)
    try:
        assert_same(load_task(cfg), direct("celeba", cfg))
        assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_missing_cache_in_read_only_folder_names_it(tmp_path, read_only_folder):
    write_celeba(tmp_path, n=10)
    shared = read_only_folder  # chmod 555, or (as root, who ignores modes) a read-only tmpfs
    with pytest.raises(CacheError) as info:
        load_task(celeba_cfg(tmp_path, cache_dir=str(shared)))
    assert str(shared) in str(info.value) and "first use" in str(info.value)


def test_cache_dir_on_a_read_only_file_system_names_it(tmp_path):
    """/proc accepts no new folders, even from root: the real read-only case on any Linux."""
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path, cache_dir="/proc/mtl_cog_cache")
    with pytest.raises(CacheError) as info:
        load_task(cfg)
    assert "/proc/mtl_cog_cache" in str(info.value) and "writable" in str(info.value)


def test_file_system_without_locks_is_one_error(tmp_path, monkeypatch):
    write_celeba(tmp_path, n=10)

    class NoLocks:
        def __init__(self, *args, **kwargs):
            pass

        def acquire(self, timeout=None):
            raise NotImplementedError("FileSystem does not appear to support flock")

    monkeypatch.setattr(locks.filelock, "FileLock", NoLocks)
    with pytest.raises(CacheError, match=r"\.lock to build the data cache .*does not appear to support flock"):
        load_task(celeba_cfg(tmp_path))


def test_use_cache_false_writes_nothing(tmp_path):
    write_celeba(tmp_path, n=10)
    cfg = celeba_cfg(tmp_path, use_cache=False)
    load_task(cfg)
    assert not (tmp_path / ".mtl_cog_cache").exists()


# ---------------------------------------------------------------------------------- hostile input


def test_bomb_jpeg_stops_the_build_naming_the_file(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    bomb = write_bomb_jpeg(fx.image_dir / fx.split_names["val"][1])
    cfg = celeba_cfg(tmp_path)
    with pytest.raises(DataError) as info:
        load_task(cfg)
    assert str(bomb) in str(info.value) and "decompression bomb" in str(info.value)
    assert leftovers(tmp_path / ".mtl_cog_cache") == [] and not cache_dir(cfg).exists()
    write_celeba(tmp_path, n=10)  # the official file back: the next build succeeds (lock released)
    assert_same(load_task(cfg), direct("celeba", cfg))


def test_reader_that_breaks_the_block_contract_is_refused(tmp_path, monkeypatch):
    cfg = DataConfig(task="synthetic", root=str(tmp_path), image_size=8,
                     synthetic=SyntheticConfig(num_attributes=2, train_size=10, val_size=5, test_size=5))
    source = TASKS.get("synthetic").open(cfg)
    source.splits["train"].read_blocks = lambda stop: iter([np.zeros((4, 3, 9, 9), np.uint8)])
    with pytest.raises(DataError, match=r"train.images.npy.*\(4, 3, 9, 9\)"):
        cache.write_source(tmp_path / "c", source, {}, show_progress=False)
    with pytest.raises(DataError, match=r"synthetic train: .*\(4, 3, 9, 9\)"):
        source.decode()  # the path without a cache checks the same
    source.splits["train"].read_blocks = lambda stop: iter([np.zeros((4, 3, 8, 8), np.uint8)])
    with pytest.raises(DataError, match="produced 4 rows, its labels say 10"):
        cache.write_source(tmp_path / "c", source, {}, show_progress=False)
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------------ concurrent builders

CONCURRENT_BUILDER = textwrap.dedent("""
    import sys, time
    import tasks
    from mtl_cog.config import DataConfig, SyntheticConfig
    from mtl_cog.data.cache import cache_dir, file_checksum, load_cached
    from mtl_cog.data.task_api import TASKS

    class SlowSynthetic:  # a build that takes seconds, so that the two processes overlap
        opened = False
        def source_files(self, data_cfg):
            return []
        def open(self, data_cfg):
            SlowSynthetic.opened = True
            source = TASKS.get("synthetic").open(data_cfg)
            for split in source.splits.values():
                inner = split.read_blocks
                def slow(stop, inner=inner):
                    time.sleep(1.0)
                    yield from inner(stop)
                split.read_blocks = slow
            return source

    cfg = DataConfig(task="synthetic", root=sys.argv[1], image_size=8,
                     synthetic=SyntheticConfig(num_attributes=3, train_size=50, val_size=20, test_size=20))
    data = load_cached(SlowSynthetic(), cfg, show_progress=True)
    print("built" if SlowSynthetic.opened else "reused", file_checksum(cache_dir(cfg) / "train.images.npy"),
          int(data.splits["train"].images.sum()))
""")


def test_two_concurrent_builders_build_once_and_both_read_it(tmp_path):
    start = [subprocess.Popen([sys.executable, "-c", CONCURRENT_BUILDER, str(tmp_path)], env=CHILD_ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [process.communicate(timeout=180) for process in start]
    assert [process.returncode for process in start] == [0, 0], results
    outcomes = sorted(out.split()[0] for out, _ in results)
    assert outcomes == ["built", "reused"], results
    assert len({tuple(out.split()[1:]) for out, _ in results}) == 1  # the same bytes for both
    waiter = next(err for out, err in results if out.startswith("reused"))
    assert "waiting for another process" in waiter and "mtl_cog: building" not in waiter
    assert leftovers(tmp_path / ".mtl_cog_cache") == []


# ------------------------------------------------------------------------------------ the command


def test_prepare_data_script_builds_then_reuses(tmp_path, capsys):
    write_celeba(tmp_path, n=10)
    command = [sys.executable, str(REPO / "scripts" / "prepare_data.py"), "--task", "celeba", "--data-root",
               str(tmp_path), "--image-size", "16", "--cache-dir", str(tmp_path / "c")]
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120, env=CHILD_ENV)
    assert first.returncode == 0, first.stderr
    assert "first use" in first.stderr
    folder = Path(first.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "c" and (folder / "meta.json").is_file()
    second = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120, env=CHILD_ENV)
    assert second.returncode == 0 and "building" not in second.stderr
    assert second.stdout.strip().splitlines()[-1] == str(folder)
    assert prepare_data.main([*command[2:], "--rebuild"]) == folder  # in-process: one interpreter start less
    assert "rebuild requested" in capsys.readouterr().err
    bad = subprocess.run([*command[:5], str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120,
                         env=CHILD_ENV)
    assert bad.returncode == 2 and "CelebA not found" in bad.stderr and "Traceback" not in bad.stderr


def test_small_blocks_give_the_same_cache(tmp_path, monkeypatch):
    """Block boundaries are invisible: a cache written 7 images at a time equals one written at once."""
    write_celeba(tmp_path, n=20)
    cfg = celeba_cfg(tmp_path)
    whole = load_cached(CountingTask("celeba"), cfg, show_progress=False)
    monkeypatch.setattr(task_api, "IMAGE_BLOCK_BYTES", 7 * 3 * 16 * 16)
    other = dataclasses.replace(cfg, cache_dir=str(tmp_path / "small_blocks"))
    assert_same(load_cached(CountingTask("celeba"), other, show_progress=False), whole)


@pytest.mark.slow
def test_cache_build_benchmark_runs_and_reports_its_targets(tmp_path):
    """The measurement script (docs/guides/data.md) on a tiny scale: numbers present and plausible."""
    result = cache_build.main(["--work", str(tmp_path), "--images", "40", "80", "--sizes", "8", "--distinct", "5",
                               "--verify-images", "600", "--epoch-steps", "1", "--repeats", "1",
                               "--out", str(tmp_path / "r.json")])
    assert [b["images"] for b in result["build"]] == [40, 80]
    assert all(0 <= b["peak_above_interpreter_bytes"] < 2**30 and b["within_1GiB"] for b in result["build"])
    verify = result["verify"]
    assert verify["images"] == 600 and verify["verify_warm_seconds"] > 0 and verify["epoch"]["epoch_seconds"] > 0
    assert json.loads((tmp_path / "r.json").read_text())["verify"]["splits"] == verify["splits"]
