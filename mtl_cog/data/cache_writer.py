"""Writing the data cache: a task's blocks streamed into preallocated ``.npy`` files, then published atomically.

The format (``FORMAT_VERSION``): per split ``<split>.images.npy`` (uint8 N x 3 x H x W),
``<split>.labels.npy`` (int64 N x T) and, where the task knows them, ``<split>.true_probs.npy``
(float32), plus ``meta.json`` (the spec, the fingerprint, every file's size and xxh3-128 checksum).
Images arrive in blocks of ``IMAGE_BLOCK_BYTES`` and go to disk with plain writes into files
reserved with ``os.posix_fallocate``: memory does not grow with the data set, a full disk shows
up before the first image is decoded, and no store into a memory map can die of SIGBUS. The files
are written into a temporary sibling folder and renamed into place (``mtl_cog.io.publish_folder``).
``mtl_cog.data.cache`` decides when to build, holds the build lock, and reads caches back.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from tqdm.auto import tqdm

from mtl_cog.data.task_api import TaskData, TaskSource
from mtl_cog.errors import CacheError, DataError
from mtl_cog.io import publish_folder, temp_folder_beside

FORMAT_VERSION = 2  # 1: one cache per data.max_samples, no checksums (such folders are ignored)


META = "meta.json"


CHECKSUM = "xxh3_128"
META_CHECKSUM = "meta_xxh3_128"  # meta.json's checksum of its own other keys


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


def meta_checksum(meta: dict[str, Any]) -> str:
    """xxh3-128 of ``meta`` without its own checksum, as canonical JSON: the files' checksums sit in
    meta.json, so without this one byte of meta.json (the spec's mean, a task name) went unchecked."""
    body = {k: v for k, v in meta.items() if k != META_CHECKSUM}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_source(folder: Path, source: TaskSource, fp: dict[str, Any], show_progress: bool = True) -> None:
    """Stream ``source`` into a new cache at ``folder`` (temporary sibling folder, then rename).

    The caller holds the build lock (``load_cached`` does).
    """
    files, splits = _plan(source)
    needed = sum(f.nbytes for f in files)
    try:
        tmp = temp_folder_beside(folder)
    except OSError as err:
        raise CacheError(_disk_error_message(folder, err, 0)) from None
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
        meta[META_CHECKSUM] = meta_checksum(meta)
        with _disk_errors(folder, needed):
            (tmp / META).write_text(json.dumps(meta, indent=1))
            publish_folder(tmp, folder)
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
