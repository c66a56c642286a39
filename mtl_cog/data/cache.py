"""Decode once: a memory-mapped uint8 cache of every task's splits, rebuilt when its source changes.

Reading CelebA means decoding 202,599 JPEGs; on a GPU that takes far longer than an epoch of a
32x32 ResNet. ``load_cached(task, data_cfg)`` therefore decodes a task once, writes each split as
``.npy`` files (uint8 images N x 3 x H x W, int64 label matrix N x T, float32 true probabilities
where the task has them) plus ``meta.json`` (the task spec and a fingerprint), and afterwards
maps those files into memory instead of decoding again.

- **Fingerprint.** Paths, sizes and modification times of ``task.source_files(data_cfg)``, the
  SHA-256 of the task's reader module (so a changed reader, or a changed generator of a built-in
  task, is noticed), and the data-config fields that change the content (task, root,
  image_size, max_samples, the synthetic options). A cache whose fingerprint differs is stale
  and rebuilt in place.
- **Atomic.** A cache is written into a temporary folder next to its final place and renamed
  into place only when complete (``meta.json`` last), so a killed build leaves no half-written
  cache that a later run would trust; concurrent builders race harmlessly (the loser keeps the
  winner's identical copy).
- **Memory-mapped.** Arrays are opened with ``numpy.load(mmap_mode="c")``: pages are read on
  first touch and shared through the OS page cache by every process of a run (8 GPU processes on
  one node hold one copy), and a cache larger than RAM still works.
- **Every task** goes through it, the generated ``synthetic`` task too: generating 202,599
  synthetic images takes ~50 s on 2 CPU cores, mapping the cache ~0 s, and one path for all
  tasks means the cache is exercised by every test run.

Where: ``data.cache_dir`` or ``<data.root>/.mtl_cog_cache``; ``data.use_cache=false`` bypasses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mtl_cog.data.task_api import SplitData, Task, TaskData, TaskSpec
from mtl_cog.errors import CacheError

FORMAT_VERSION = 1
META = "meta.json"
SPLITS = ("train", "val", "test")
WRITE_CHUNK = 8192  # images copied per progress-bar tick


def cache_root(data_cfg) -> Path:
    """``data.cache_dir`` or ``<data.root>/.mtl_cog_cache``."""
    return Path(data_cfg.cache_dir) if data_cfg.cache_dir else Path(data_cfg.root) / ".mtl_cog_cache"


def content_key(data_cfg) -> dict[str, Any]:
    """The config fields that decide what a task decodes to (one cache folder per distinct key)."""
    return {
        "task": data_cfg.task,
        "root": str(Path(data_cfg.root).resolve()),
        "image_size": data_cfg.image_size,
        "max_samples": data_cfg.max_samples,
        # Only generated tasks read these; keeping them for all tasks costs at worst a rebuild.
        "synthetic": dataclasses.asdict(data_cfg.synthetic),
    }


def cache_dir(data_cfg) -> Path:
    """The folder of this config's cache: readable name + hash of the full content key."""
    key = content_key(data_cfg)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    cap = "all" if data_cfg.max_samples is None else str(data_cfg.max_samples)
    return cache_root(data_cfg) / f"{data_cfg.task}-{data_cfg.image_size}px-{cap}-{digest}"


def fingerprint(task: Task, data_cfg) -> dict[str, Any]:
    """What must be unchanged for a cache to be trusted (see the module docstring)."""
    sources = []
    for path in task.source_files(data_cfg):
        path = Path(path)
        try:
            stat = path.stat()
            sources.append({"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
        except FileNotFoundError:
            sources.append({"path": str(path.resolve()), "missing": True})
    return {
        "format": FORMAT_VERSION,
        "content": content_key(data_cfg),
        "sources": sources,
        "reader": _reader_digest(task),
    }


def _reader_digest(task: Task) -> str:
    """SHA-256 of the source file of the task's class: a code change invalidates its caches."""
    try:
        source = inspect.getsourcefile(type(task))
    except TypeError:  # built-in or dynamically created class
        source = None
    if not source or not Path(source).is_file():
        return f"{type(task).__module__}.{type(task).__qualname__}"
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ read


def load_cached(task: Task, data_cfg, show_progress: bool = True) -> TaskData:
    """The task's splits from its cache, decoding and writing the cache first if absent or stale."""
    folder = cache_dir(data_cfg)
    expected = fingerprint(task, data_cfg)
    cached = read_cache(folder, expected)
    if cached is not None:
        return cached
    if show_progress:
        reason = "stale (source, reader or format changed)" if (folder / META).exists() else "first use"
        print(f"mtl_cog: building the {data_cfg.task!r} cache in {folder} ({reason}) ...", file=sys.stderr)
    task_data = task.load(data_cfg)
    # A download during load() creates the sources: fingerprint what was actually read.
    write_cache(folder, task_data, fingerprint(task, data_cfg), show_progress=show_progress)
    cached = read_cache(folder, None)
    if cached is None:  # pragma: no cover - only if someone deletes the folder under us
        raise CacheError(f"the cache just written to {folder} cannot be read back.")
    return cached


def read_cache(folder: Path, expected_fingerprint: dict[str, Any] | None) -> TaskData | None:
    """Memory-mapped ``TaskData`` from ``folder``, or None if missing, incomplete or stale.

    ``expected_fingerprint=None`` skips the staleness check (used right after writing).
    """
    meta_path = folder / META
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    if meta.get("format") != FORMAT_VERSION:
        return None
    if expected_fingerprint is not None and meta.get("fingerprint") != expected_fingerprint:
        return None
    try:
        splits = {name: _read_split(folder, name, info) for name, info in meta["splits"].items()}
        spec = _spec_from_dict(meta["spec"])
    except (KeyError, ValueError, OSError):  # a damaged cache is rebuilt, never trusted
        return None
    return TaskData(spec=spec, splits=splits)


def _read_split(folder: Path, name: str, info: dict[str, Any]) -> SplitData:
    images = _map(folder / f"{name}.images.npy", np.uint8, info["images"])
    labels = _map(folder / f"{name}.labels.npy", np.int64, info["labels"])
    probs = None
    if info.get("true_probs") is not None:
        probs = _map(folder / f"{name}.true_probs.npy", np.float32, info["true_probs"])
    return SplitData(images=torch.from_numpy(images), labels=torch.from_numpy(labels), true_probs=probs)


def _map(path: Path, dtype: type, shape: list[int]) -> np.ndarray:
    # "c" = copy-on-write: a writable view (torch.from_numpy needs one) that never writes the file.
    array = np.load(path, mmap_mode="c")
    if array.dtype != dtype or list(array.shape) != list(shape):
        raise ValueError(f"{path}: {array.dtype} {array.shape}, expected {np.dtype(dtype)} {shape}.")
    return array


def _spec_from_dict(raw: dict[str, Any]) -> TaskSpec:
    tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return TaskSpec(**tuples)


# ----------------------------------------------------------------------------------------- write


def write_cache(folder: Path, task_data: TaskData, fp: dict[str, Any], show_progress: bool = True) -> None:
    """Write ``task_data`` into ``folder`` atomically (temporary sibling folder, then rename)."""
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".tmp-{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as err:
        raise CacheError(
            f"cannot create the data cache under {parent}: {err}. Set data.cache_dir to a writable folder "
            "or data.use_cache=false."
        ) from None
    try:
        splits_meta = {}
        total = sum(len(s) for s in task_data.splits.values())
        with tqdm(total=total, desc=f"writing cache {folder.name}", unit="img", disable=not show_progress,
                  leave=False) as bar:
            for name, split in task_data.splits.items():
                splits_meta[name] = _write_split(tmp, name, split, bar)
        meta = {
            "format": FORMAT_VERSION,
            "fingerprint": fp,
            "spec": dataclasses.asdict(task_data.spec),
            "splits": splits_meta,
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))
        _fsync_folder(tmp)
        _move_into_place(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_split(tmp: Path, name: str, split: SplitData, bar: tqdm) -> dict[str, Any]:
    images = split.images
    out = np.lib.format.open_memmap(tmp / f"{name}.images.npy", mode="w+", dtype=np.uint8, shape=tuple(images.shape))
    for start in range(0, len(images), WRITE_CHUNK):
        block = images[start : start + WRITE_CHUNK]
        out[start : start + len(block)] = block.cpu().numpy()
        bar.update(len(block))
    out.flush()
    del out
    labels = split.labels.cpu().numpy().astype(np.int64, copy=False)
    np.save(tmp / f"{name}.labels.npy", labels)
    info: dict[str, Any] = {"images": list(images.shape), "labels": list(labels.shape), "true_probs": None}
    if split.true_probs is not None:
        probs = np.asarray(split.true_probs, dtype=np.float32)
        np.save(tmp / f"{name}.true_probs.npy", probs)
        info["true_probs"] = list(probs.shape)
    return info


def _fsync_folder(folder: Path) -> None:
    """Flush every file so that the rename publishes complete data even after a power loss."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; a stale ``folder`` is moved aside first and then deleted."""
    stale = None
    if folder.exists():
        stale = folder.with_name(f".stale-{folder.name}-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(folder, stale)
        except FileNotFoundError:  # another process moved it away meanwhile
            stale = None
    try:
        os.replace(tmp, folder)
    except OSError:
        # Another process published its (identical) cache between our checks: keep theirs.
        if not (folder / META).exists():
            raise
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)
