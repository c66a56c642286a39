"""Decode once: a memory-mapped uint8 cache of every task's splits, checksummed, built once per file system.

Reading CelebA means decoding 202,599 JPEGs; on a GPU that takes far longer than an epoch of a
32x32 ResNet. ``load_cached(task, data_cfg)`` therefore decodes a task once, writes each split as
``.npy`` files (uint8 images N x 3 x H x W, int64 label matrix N x T, float32 true probabilities
where the task has them) plus ``meta.json`` (the task spec, a fingerprint, a checksum per file),
and afterwards maps those files into memory instead of decoding again. docs/guides/data.md has the
layout and the reasons in full.

- **One cache for every cap.** The cache holds every sample; ``data.max_samples`` takes the first
  N of each split from it (``TaskData.head``), so a quick capped run and the full run share it.
- **Fingerprint.** Paths, sizes and modification times of ``task.source_files(data_cfg)``, the
  SHA-256 of the task's reader module (so a changed reader, or a changed generator of a built-in
  task, is noticed), and the data-config fields that change the content (task, root,
  image_size, the per-task options: synthetic, fashion_mosaic). A cache whose fingerprint differs is stale and rebuilt.
- **Checksums.** Every file's xxh3-128 digest is computed while it is written and verified each
  time the cache is opened, before anything trains on it; the label matrix is range-checked
  against the spec too. Damaged content (zeroed pages, flipped labels, a truncated file) is
  reported and rebuilt from the sources, or refused with an error where it cannot be rebuilt.
  xxh3 hashes at memory speed (~30 GB/s on one core here), so verifying costs about one
  sequential read of the cache; ``python -m mtl_cog.benchmarks.cache_build`` measures it against
  a training epoch. It detects accidents (bad disks, copies, stray writes), not an attacker,
  who could rewrite meta.json as well.
- **Streaming build** (``mtl_cog.data.cache_writer``). Images arrive from the task in blocks
  of ``IMAGE_BLOCK_BYTES`` (``mtl_cog.data.task_api``) and go to disk with plain file writes into
  preallocated files (``os.posix_fallocate``): memory does not grow with the data set, a full disk
  shows up before the first image is decoded, and no store into a memory map can die of SIGBUS on
  a full disk. Any write error ends as one ``CacheError`` naming the folder, the space needed and
  what to do.
- **Atomic.** A cache is written into a temporary folder next to its final place and renamed
  into place only when complete (``mtl_cog.io.publish_folder``, the project's crash-safe writes),
  so a killed build leaves no half-written cache that a later run would trust; the next builder
  removes the temporary folders that killed builders left.
- **One builder.** Builders take a lock (``<folder>.lock``, ``mtl_cog.locks.waiting_lock``:
  ``flock``, which the kernel releases when its holder dies, and which NFS carries between nodes).
  Others wait for it, then find the finished cache. Reading a valid cache takes no lock and writes
  nothing, so any number of processes and nodes read one cache concurrently, from a read-only
  folder too.
- **Memory-mapped.** Arrays are opened with ``numpy.load(mmap_mode="c")``: pages are read on
  first touch and shared through the OS page cache by every process of a run (8 GPU processes on
  one node hold one copy), and a cache larger than RAM still works.

Where: ``data.cache_dir`` or ``<data.root>/.mtl_cog_cache``; ``data.use_cache=false`` bypasses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from mtl_cog.data.cache_writer import CHECKSUM, FORMAT_VERSION, META, META_CHECKSUM, meta_checksum, write_source
from mtl_cog.data.task_api import SplitData, Task, TaskData, TaskSpec, check_labels
from mtl_cog.errors import CacheError, DataError
from mtl_cog.io import remove_folder_leftovers
from mtl_cog.locks import waiting_lock

READ_CHUNK = 16 * 2**20  # bytes per read while verifying: constant memory, any file size


def cache_root(data_cfg) -> Path:
    """``data.cache_dir`` or ``<data.root>/.mtl_cog_cache``."""
    return Path(data_cfg.cache_dir) if data_cfg.cache_dir else Path(data_cfg.root) / ".mtl_cog_cache"


def content_key(data_cfg) -> dict[str, Any]:
    """The config fields that decide what a task decodes to (one cache folder per distinct key).

    ``data.max_samples`` is not among them: a capped run reads a prefix of the full cache.
    """
    return {
        "task": data_cfg.task,
        "root": str(Path(data_cfg.root).resolve()),
        "image_size": data_cfg.image_size,
        # Only the tasks they belong to read these; keeping them for all tasks costs at worst a rebuild.
        "synthetic": dataclasses.asdict(data_cfg.synthetic),
        "fashion_mosaic": dataclasses.asdict(data_cfg.fashion_mosaic),
    }


def cache_dir(data_cfg) -> Path:
    """The folder of this config's cache: readable name + hash of the full content key."""
    key = content_key(data_cfg)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root(data_cfg) / f"{data_cfg.task}-{data_cfg.image_size}px-{digest}"


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
    except (TypeError, OSError):  # built-in, dynamically created, or defined in `python -c`
        source = None
    if not source or not Path(source).is_file():
        return f"{type(task).__module__}.{type(task).__qualname__}"
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ load


def load_cached(task: Task, data_cfg, show_progress: bool = True) -> TaskData:
    """All of the task's splits from its verified cache, building it first if absent, stale or damaged.

    The caller takes ``data.max_samples`` as a prefix (``TaskData.head``).
    """
    folder = cache_dir(data_cfg)
    cached, problem = inspect_cache(folder, fingerprint(task, data_cfg))  # no lock: readers never wait
    if cached is not None:
        return cached
    return _build(task, data_cfg, folder, problem, show_progress)


def rebuild(task: Task, data_cfg, show_progress: bool = True) -> TaskData:
    """Decode the task again and replace its cache, whatever state the cache is in."""
    return _build(task, data_cfg, cache_dir(data_cfg), "rebuild requested", show_progress, force=True)


def _build(task: Task, data_cfg, folder: Path, problem: str, show_progress: bool, force: bool = False) -> TaskData:
    with _build_lock(folder, problem, show_progress):
        if not force:  # another process may have built it while we waited for the lock
            cached, problem = inspect_cache(folder, fingerprint(task, data_cfg))
            if cached is not None:
                return cached
        remove_folder_leftovers(folder)
        if show_progress:
            print(f"mtl_cog: building the {data_cfg.task!r} cache in {folder} ({problem}) ...", file=sys.stderr)
            _mention_old_caches(folder)
        try:
            source = task.open(data_cfg)
            # A download during open() creates the sources: fingerprint what was actually read.
            write_source(folder, source, fingerprint(task, data_cfg), show_progress=show_progress)
            del source  # its labels are in the files now: do not hold them twice while reading back
        except DataError as err:
            if problem.startswith("damaged"):  # say both: why a rebuild was needed and why it failed
                raise DataError(f"the cache {folder} is {problem}, and rebuilding it failed: {err}") from None
            raise
        cached, problem = inspect_cache(folder, None)  # reads back and verifies what was written
        if cached is None:
            raise CacheError(
                f"the cache just written to {folder} does not read back ({problem}): the disk or file "
                "system may be failing. Set data.cache_dir to another folder or data.use_cache=false."
            )
        return cached


def inspect_cache(folder: Path, expected_fingerprint: dict[str, Any] | None) -> tuple[TaskData | None, str]:
    """(memory-mapped ``TaskData``, "") for a complete, current, undamaged cache; else (None, why not).

    Verifies every file's size and checksum and the label ranges. The reason starts with
    "first use", "stale" or "damaged". ``expected_fingerprint=None`` skips the staleness check.
    """
    try:
        meta = json.loads((folder / META).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, "first use"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"damaged: {META} is unreadable ({err})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        return None, "stale: written by another version of the cache format"
    if META_CHECKSUM not in meta:
        return None, f"stale: written before {META} was checksummed itself"
    if meta_checksum(meta) != meta[META_CHECKSUM]:  # the spec (normalisation, task names) flows into training
        return None, f"damaged: {META} does not match its own checksum (its content changed after it was written)"
    if expected_fingerprint is not None and meta.get("fingerprint") != expected_fingerprint:
        return None, "stale: its source files, reader code or data options changed"
    try:
        for name, expected in meta["files"].items():
            problem = _verify_file(folder / name, expected)
            if problem:
                return None, f"damaged: {name} {problem}"
        unverified = {f for files in meta["splits"].values() for f in files.values()} - set(meta["files"])
        if unverified:
            return None, f"damaged: {META} lists {sorted(unverified)} without a checksum"
        spec = _spec_from_dict(meta["spec"])
        splits = {name: _read_split(folder, name, spec, files) for name, files in meta["splits"].items()}
    except (KeyError, TypeError, ValueError, OSError, DataError) as err:
        return None, f"damaged: {err}"
    return TaskData(spec=spec, splits=splits), ""


def read_cache(folder: Path, expected_fingerprint: dict[str, Any] | None) -> TaskData | None:
    """The verified cache in ``folder``, or None (see ``inspect_cache`` for why not)."""
    return inspect_cache(folder, expected_fingerprint)[0]


def _verify_file(path: Path, expected: dict[str, Any]) -> str:
    """"" if ``path`` has the recorded size and checksum, else what is wrong with it."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "is missing"
    if size != expected["bytes"]:
        return f"has {size} bytes, {expected['bytes']} were written"
    if file_checksum(path) != expected[CHECKSUM]:
        return "does not match its checksum (its content changed after it was written)"
    return ""


def file_checksum(path: Path) -> str:
    """xxh3-128 of the file's bytes, read in ``READ_CHUNK`` pieces (plain reads: no RSS growth)."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def _read_split(folder: Path, name: str, spec: TaskSpec, files: dict[str, Any]) -> SplitData:
    images = _map(folder / files["images"], np.uint8, 4)
    labels = _map(folder / files["labels"], np.int64, 2)
    check_labels(spec, labels, f"{files['labels']}")  # a cache is trusted only with valid labels
    probs = None
    if files.get("true_probs"):
        probs = _map(folder / files["true_probs"], np.float32, 2)
    return SplitData(images=torch.from_numpy(images), labels=torch.from_numpy(labels), true_probs=probs)


def _map(path: Path, dtype: type, ndim: int) -> np.ndarray:
    # "c" = copy-on-write: a writable view (torch.from_numpy needs one) that never writes the file.
    with open(path, "rb") as handle:  # an empty split cannot be memory-mapped (mmap of 0 bytes)
        if np.lib.format.read_magic(handle) != (1, 0):  # write_source writes version 1.0 only
            raise ValueError(f"{path.name}: not a version 1.0 .npy file.")
        shape, _, file_dtype = np.lib.format.read_array_header_1_0(handle)
    if file_dtype != dtype or len(shape) != ndim:
        raise ValueError(f"{path.name}: {file_dtype} with shape {shape}, expected {np.dtype(dtype)} of {ndim} dims.")
    if 0 in shape:
        return np.empty(shape, dtype=dtype)
    return np.load(path, mmap_mode="c")


def _spec_from_dict(raw: dict[str, Any]) -> TaskSpec:
    tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return TaskSpec(**tuples)


# ------------------------------------------------------------------------------------ one builder


def lock_path(folder: Path) -> Path:
    """The lock file of a cache folder's builders (it stays after use; only its lock matters)."""
    return folder.with_name(f"{folder.name}.lock")


def _build_lock(folder: Path, problem: str, show_progress: bool) -> AbstractContextManager[None]:
    """Hold the build lock of ``folder`` (``mtl_cog.locks.waiting_lock``); wait, saying so, while another builds."""
    path = lock_path(folder)

    def on_wait() -> None:
        if show_progress:
            print(f"mtl_cog: waiting for another process to finish building {folder} (lock {path}) ...",
                  file=sys.stderr)

    def unusable(err: BaseException, locking: bool) -> CacheError:
        if locking:  # a file system without working locks
            return CacheError(
                f"cannot lock {path} to build the data cache {folder}: {err}. The file system may not support "
                "file locks (e.g. Lustre mounted without -o flock): set data.cache_dir to a folder on another "
                "file system, or build the cache once with scripts/prepare_data.py before starting the jobs.")
        return CacheError(
            f"the data cache {folder} is not usable ({problem}) and cannot be built there: "
            f"{getattr(err, 'strerror', None) or err} ({path}). Set data.cache_dir to a writable folder, run "
            "scripts/prepare_data.py where the folder is writable, or set data.use_cache=false.")

    return waiting_lock(path, on_wait, unusable)


build_lock = _build_lock  # also taken by the builders of corrupted test splits (mtl_cog.data.shift)


def _mention_old_caches(folder: Path) -> None:
    """Point at caches of the previous format (one per data.max_samples) that nothing reads any more."""
    task_prefix = folder.name.rsplit("-", 1)[0] + "-"
    old = []
    for path in folder.parent.glob(f"{task_prefix}*"):
        try:
            if path.is_dir() and json.loads((path / META).read_text()).get("format") != FORMAT_VERSION:
                old.append(path)
        except (OSError, ValueError, AttributeError):
            continue
    if old:
        print(f"mtl_cog: {len(old)} cache folder(s) of an older format are no longer read and can be deleted: "
              + ", ".join(str(p) for p in old), file=sys.stderr)
