"""Decode once: a memory-mapped uint8 cache of every task's splits, checksummed, built once per file system.

Reading CelebA means decoding 202,599 JPEGs; on a GPU that takes far longer than an epoch of a
32x32 ResNet. ``load_cached(task, data_cfg)`` therefore decodes a task once, writes each split as
``.npy`` files (uint8 images N x 3 x H x W, int64 label matrix N x T, float32 true probabilities
where the task has them) plus ``meta.json`` (the task spec, a fingerprint, a checksum per file),
and afterwards maps those files into memory instead of decoding again. docs/data.md has the
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
- **Streaming build.** Images arrive from the task in blocks of ``IMAGE_BLOCK_BYTES``
  (``mtl_cog.data.task_api``) and go to disk with plain file writes into preallocated files
  (``os.posix_fallocate``): memory does not grow with the data set, a full disk shows up before
  the first image is decoded, and no store into a memory map can die of SIGBUS on a full disk.
  Any write error ends as one ``CacheError`` naming the folder, the space needed and what to do.
- **Atomic.** A cache is written into a temporary folder next to its final place and renamed
  into place only when complete, so a killed build leaves no half-written cache that a later run
  would trust; the next builder removes the temporary folders that killed builders left.
- **One builder.** Builders take a lock (``<folder>.lock``, ``filelock``: ``flock``, which the
  kernel releases when its holder dies, and which NFS carries between nodes). Others wait for it,
  then find the finished cache. Reading a valid cache takes no lock and writes nothing, so any
  number of processes and nodes read one cache concurrently, from a read-only folder too.
- **Memory-mapped.** Arrays are opened with ``numpy.load(mmap_mode="c")``: pages are read on
  first touch and shared through the OS page cache by every process of a run (8 GPU processes on
  one node hold one copy), and a cache larger than RAM still works.

Where: ``data.cache_dir`` or ``<data.root>/.mtl_cog_cache``; ``data.use_cache=false`` bypasses it.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import inspect
import io
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import torch
import xxhash
from tqdm.auto import tqdm

from mtl_cog.data.task_api import SplitData, Task, TaskData, TaskSource, TaskSpec, check_labels
from mtl_cog.errors import CacheError, DataError

FORMAT_VERSION = 2  # 1: one cache per data.max_samples, no checksums (such folders are ignored)
META = "meta.json"
CHECKSUM = "xxh3_128"
READ_CHUNK = 16 * 2**20  # bytes per read while verifying: constant memory, any file size
LOCK_WAIT_MESSAGE_EVERY = 60.0  # seconds between "still waiting for the builder" messages


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
        _remove_leftovers(folder)
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


# ----------------------------------------------------------------------------------------- write


@dataclasses.dataclass
class _ArrayFile:
    """One ``.npy`` file of the cache: its name, dtype, shape and where its rows come from."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    blocks: Iterable[np.ndarray]
    counts_images: bool = False  # advances the progress bar

    @property
    def header(self) -> bytes:
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape})
        return buffer.getvalue()

    @property
    def nbytes(self) -> int:
        return len(self.header) + int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _plan(source: TaskSource) -> tuple[list[_ArrayFile], dict[str, dict[str, str]]]:
    """The files of a cache of ``source`` and, per split, which file holds what."""
    files, splits = [], {}
    size = source.image_size
    for name, split in source.splits.items():
        n = len(split)
        entry = {"images": f"{name}.images.npy", "labels": f"{name}.labels.npy"}
        files.append(_ArrayFile(entry["images"], np.dtype(np.uint8), (n, 3, size, size), split.read_blocks(n),
                                counts_images=True))
        labels = np.ascontiguousarray(split.labels, dtype=np.int64)
        files.append(_ArrayFile(entry["labels"], np.dtype(np.int64), labels.shape, [labels]))
        if split.true_probs is not None:
            entry["true_probs"] = f"{name}.true_probs.npy"
            probs = np.ascontiguousarray(split.true_probs, dtype=np.float32)
            files.append(_ArrayFile(entry["true_probs"], np.dtype(np.float32), probs.shape, [probs]))
        splits[name] = entry
    return files, splits


def write_source(folder: Path, source: TaskSource, fp: dict[str, Any], show_progress: bool = True) -> None:
    """Stream ``source`` into a new cache at ``folder`` (temporary sibling folder, then rename).

    The caller holds the build lock (``load_cached`` does).
    """
    files, splits = _plan(source)
    needed = sum(f.nbytes for f in files)
    tmp = _make_temp_folder(folder)
    try:
        with _disk_errors(folder, needed):
            for file in files:  # reserve all space first: a full disk fails now, not after hours
                _preallocate(tmp / file.name, file.nbytes)
        checksums = {}
        total = sum(f.shape[0] for f in files if f.counts_images)
        with tqdm(total=total, desc=f"writing cache {folder.name}", unit="img", disable=not show_progress,
                  leave=False) as bar:
            for file in files:
                checksums[file.name] = _write_array(tmp / file.name, file, folder, needed, bar)
        meta = {
            "format": FORMAT_VERSION,
            "fingerprint": fp,
            "spec": dataclasses.asdict(source.spec),
            "image_size": source.image_size,
            "splits": splits,
            "files": checksums,
        }
        with _disk_errors(folder, needed):
            (tmp / META).write_text(json.dumps(meta, indent=1))
            _fsync_folder(tmp)
            _move_into_place(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_cache(folder: Path, task_data: TaskData, fp: dict[str, Any], show_progress: bool = True) -> None:
    """Write already decoded ``task_data`` as a cache at ``folder`` (see ``write_source``)."""
    write_source(folder, TaskSource.from_task_data(task_data), fp, show_progress=show_progress)


def _write_array(path: Path, file: _ArrayFile, folder: Path, needed: int, bar: tqdm) -> dict[str, Any]:
    """Write header + rows of ``file`` with plain writes, hashing them on the way; returns size and checksum."""
    header = file.header
    digest = xxhash.xxh3_128(header)
    rows = 0
    with _disk_errors(folder, needed):
        handle = open(path, "r+b")  # preallocated: overwrite in place, never truncate
    try:
        with _disk_errors(folder, needed):
            handle.write(header)
        for block in file.blocks:  # the task decodes here: its errors pass through unchanged
            block = np.ascontiguousarray(block)
            if block.dtype != file.dtype or block.shape[1:] != file.shape[1:] or rows + len(block) > file.shape[0]:
                raise DataError(
                    f"{file.name}: the task's reader produced a block of {block.dtype} {block.shape} after "
                    f"{rows} rows; expected {file.dtype} rows of shape {file.shape[1:]}, {file.shape[0]} in all."
                )
            with _disk_errors(folder, needed):
                handle.write(block.reshape(-1).view(np.uint8))
            digest.update(block)
            rows += len(block)
            if file.counts_images:
                bar.update(len(block))
    finally:
        with _disk_errors(folder, needed):
            handle.close()
    if rows != file.shape[0]:
        raise DataError(f"{file.name}: the task's reader produced {rows} rows, its labels say {file.shape[0]}.")
    return {"bytes": file.nbytes, CHECKSUM: digest.hexdigest()}


def _preallocate(path: Path, nbytes: int) -> None:
    """Create ``path`` with ``nbytes`` reserved on disk (ENOSPC / EFBIG now rather than mid-build)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if nbytes:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                # This file system cannot reserve space: the writes below still fail cleanly
                # (plain writes report ENOSPC as an error; only memory-map stores die of SIGBUS).
    finally:
        os.close(fd)


@contextmanager
def _disk_errors(folder: Path, needed: int) -> Iterator[None]:
    """Turn an OS error of a cache write into one ``CacheError`` naming the folder and the remedy."""
    try:
        yield
    except CacheError:
        raise
    except OSError as err:
        raise CacheError(_disk_error_message(folder, err, needed)) from None


def _disk_error_message(folder: Path, err: OSError, needed: int) -> str:
    what = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f"{_size(shutil.disk_usage(folder.parent).free)} free"
        except OSError:
            free = "free space unknown"
        advice = f"it needs {_size(needed)} ({free}). Free space there"
    elif err.errno == errno.EFBIG:
        advice = (f"it needs {_size(needed)} and a file-size limit stopped it (`ulimit -f`, or the file "
                  "system's largest file). Raise the limit")
    elif err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = "the folder is not writable. Build it where it is writable"
    else:
        advice = f"it needs {_size(needed)}. Check that file system"
    return (f"cannot write the data cache {folder}: {what}; {advice}, or set data.cache_dir to another "
            "folder, or data.use_cache=false. Nothing was left behind.")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _make_temp_folder(folder: Path) -> Path:
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
    except OSError as err:
        raise CacheError(_disk_error_message(folder, err, 0)) from None
    return tmp


def _fsync_folder(folder: Path) -> None:
    """Flush every file so that the rename publishes complete data even after a power loss."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; a previous ``folder`` is moved aside first and then deleted.

    Processes still reading the previous cache keep their open files (POSIX keeps an unlinked
    file's data until the last reader closes it).
    """
    stale = None
    if folder.exists():
        stale = folder.with_name(f".stale-{folder.name}-{uuid.uuid4().hex[:8]}")
        os.replace(folder, stale)
    os.replace(tmp, folder)
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


# ------------------------------------------------------------------------------------ one builder


def lock_path(folder: Path) -> Path:
    """The lock file of a cache folder's builders (it stays after use; only its lock matters)."""
    return folder.with_name(f"{folder.name}.lock")


@contextmanager
def _build_lock(folder: Path, problem: str, show_progress: bool) -> Iterator[None]:
    """Hold the build lock of ``folder``; wait (with a message) while another process builds."""
    path = lock_path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o666))  # fail here, clearly, if not writable
    except OSError as err:
        raise CacheError(
            f"the data cache {folder} is not usable ({problem}) and cannot be built there: {err.strerror or err} "
            f"({path}). Set data.cache_dir to a writable folder, run scripts/prepare_data.py where the "
            "folder is writable, or set data.use_cache=false."
        ) from None
    lock = filelock.FileLock(str(path), mode=0o666)
    waited = False
    while True:
        try:
            lock.acquire(timeout=LOCK_WAIT_MESSAGE_EVERY if waited else 0)
            break
        except filelock.Timeout:  # (a TimeoutError, itself an OSError: caught first)
            if show_progress:
                print(f"mtl_cog: waiting for another process to finish building {folder} (lock {path}) ...",
                      file=sys.stderr)
            waited = True
        except (NotImplementedError, OSError) as err:  # a file system without working locks
            raise CacheError(
                f"cannot lock {path} to build the data cache {folder}: {err}. The file system may not support "
                "file locks (e.g. Lustre mounted without -o flock): set data.cache_dir to a folder on another "
                "file system, or build the cache once with scripts/prepare_data.py before starting the jobs."
            ) from None
    try:
        yield
    finally:
        lock.release()


build_lock = _build_lock  # also taken by the builders of corrupted test splits (mtl_cog.data.shift)


def _remove_leftovers(folder: Path) -> None:
    """Delete temporary and stale folders of this cache that killed builders left (we hold the lock)."""
    for prefix in (".tmp-", ".stale-"):
        for path in folder.parent.glob(f"{prefix}{folder.name}-*"):
            shutil.rmtree(path, ignore_errors=True)


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
