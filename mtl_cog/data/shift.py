"""Corrupted test splits (Hendrycks & Dietterich, ICLR 2019), each built once into the cache and reused.

The 15 corruptions (``mtl_cog.constants.CORRUPTIONS``) at severities 1–5 come in two *suites*
(``eval.shift_suite``, ``evaluate --shift --suite``), which differ in the severity parameters:

- ``cifar10c``: CIFAR-10-C's, from the authors' ``make_cifar_c.py`` (mtl_cog.data.cifar_c, our own
  code of the script's steps); the default for pictures of at most 64 px;
- ``imagenetc``: ImageNet-C's, from ``imagecorruptions-imaug`` (the maintained fork of Michaelis et
  al.'s ``imagecorruptions``, the package of the ImageNet-C code; the original calls scikit-image
  APIs that current versions removed); the default above 64 px. At 32 px its severity 1–2 moves
  pixels as much as CIFAR-10-C's 5 for most corruptions.

Every image is corrupted with its own seed, drawn from ``(eval.shift_seed, corruption, severity,
image index)``, so a corrupted image does not depend on how many images are built, in which block
or by which process, and the same seed gives the same pixels on every run. Images smaller than
32 px (imagecorruptions' minimum, and the side CIFAR-10-C's parameters were made for; e.g. 28 px
Fashion-MNIST) are reflect-padded to 32 px, corrupted and cropped back. ``corrupt`` shows what a
severity does to a few pictures.

**Official files.** A task may offer ``official_corruption(data_cfg, name) -> (images, labels)``
(``tasks/cifar.py``: ``<data.root>/CIFAR-10-C/<name>.npy``, (5·N, 32, 32, 3) uint8, severity s in
rows (s − 1)·N .. s·N − 1, and ``labels.npy``); under the ``cifar10c`` suite, when it returns files,
they are used instead of corrupting, after their labels are checked against the test split's.

**Cache.** ``<cache root>/shift/<clean cache folder>/<suite>/<name>-s<severity>-seed<seed>-n<N>/``, written
by the data cache's own writer (``mtl_cog.data.cache.write_source``: build lock, atomic rename,
checksums, progress bar). Its fingerprint holds the clean images' checksum, the seed, the
package's version and this module's code, so a change of any of them rebuilds it.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash

from mtl_cog.constants import AUTO_SUITE_MAX_SIDE, CORRUPTIONS, SEVERITIES, SHIFT_SUITES
from mtl_cog.data import cache, cifar_c
from mtl_cog.data.task_api import SplitData, SplitSource, Task, TaskSource, TaskSpec, block_ranges
from mtl_cog.errors import ConfigError, DataError

MIN_SIDE = 32  # imagecorruptions refuses smaller images
CHUNK = 64  # images per job of a worker process


MAX_SEED = 2**32 - 1  # numpy's global seeding takes [0, 2**32 - 1]


def _whole(value) -> bool:
    """An int (or numpy integer), not a bool or a float that happens to be whole (2.0 == 2 in Python)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_corruption(name: str, severity: int) -> None:
    if name not in CORRUPTIONS:
        raise ConfigError(f"unknown corruption {name!r}. Known: {', '.join(CORRUPTIONS)}.")
    if not _whole(severity) or severity not in (0, *SEVERITIES):
        raise ConfigError(f"corruption severity must be 1..5 (0 = none). Got {severity!r}.")


def resolve_suite(suite: str, image_size: int) -> str:
    """``eval.shift_suite`` for pictures of ``image_size`` px: ``auto`` -> cifar10c up to 64 px, imagenetc above."""
    if suite == "auto":
        return SHIFT_SUITES[0] if image_size <= AUTO_SUITE_MAX_SIDE else SHIFT_SUITES[1]
    if suite not in SHIFT_SUITES:
        raise ConfigError(f"unknown corruption suite {suite!r}. Known: auto, {', '.join(SHIFT_SUITES)}.")
    return suite


def image_seed(seed: int, name: str, severity: int, index: int) -> int:
    """The seed of one corrupted image: independent of block, process and how many images are built."""
    entropy = [seed, CORRUPTIONS.index(name), severity, index]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def corrupt(images: np.ndarray, name: str, severity: int, suite: str = "cifar10c", seed: int = 0) -> np.ndarray:
    """Pictures uint8 (n, H, W, 3) (NHWC, as a picture library holds them) -> the same pictures corrupted.

    ``name`` one of ``mtl_cog.constants.CORRUPTIONS``, ``severity`` 1..5 (0: unchanged), ``suite``
    cifar10c or imagenetc; picture i gets the seed of index i under ``seed``, as in a corrupted split.
    """
    if not _whole(seed) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"corrupt(): seed must be a whole number in [0, {MAX_SEED}]; got {seed!r}.")
    check_corruption(name, severity)
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or images.shape[1] != images.shape[2]:
        raise ConfigError(f"corrupt() takes square uint8 pictures (n, H, W, 3); got {images.dtype} {images.shape}.")
    suite = resolve_suite(suite, images.shape[1])
    return corrupt_images(images.transpose(0, 3, 1, 2), name, severity, seed, suite=suite).transpose(0, 2, 3, 1)


def corrupt_images(images: np.ndarray, name: str, severity: int, seed: int, first_index: int = 0,
                   suite: str = "cifar10c") -> np.ndarray:
    """uint8 (n, 3, S, S) -> the same images corrupted; image i uses ``image_seed(.., first_index + i)``.

    Severity 0 returns the images unchanged.
    """
    check_corruption(name, severity)
    if severity == 0:
        return images.copy()
    if suite == "imagenetc":
        from imagecorruptions import corrupt as package  # imported here: it loads OpenCV and numba (seconds)
    else:
        def package(hwc, corruption_name, severity, **_):
            return cifar_c.corrupt_cifar(hwc, corruption_name, severity)

    size = images.shape[-1]
    pad = max(0, MIN_SIDE - size)
    before = pad // 2
    out = np.empty_like(images)
    for i, image in enumerate(images):
        hwc = np.ascontiguousarray(image.transpose(1, 2, 0))
        if pad:
            hwc = np.pad(hwc, ((before, pad - before), (before, pad - before), (0, 0)), mode="reflect")
        s = image_seed(seed, name, severity, first_index + i)
        np.random.seed(s)  # most corruptions draw from numpy's global generator
        kwargs = {"seed": s} if name in ("impulse_noise", "glass_blur") else {}  # imagecorruptions: their own
        result = np.asarray(package(hwc, corruption_name=name, severity=severity, **kwargs))
        result = np.clip(np.rint(result), 0, 255).astype(np.uint8) if result.dtype != np.uint8 else result
        if result.shape[:2] != hwc.shape[:2]:  # a few corruptions round the size of non-square/odd images
            raise DataError(f"corruption {name} changed the image size {hwc.shape[:2]} to {result.shape[:2]}.")
        if pad:
            result = result[before:before + size, before:before + size]
        out[i] = result.transpose(2, 0, 1)
    return out


def _corrupt_job(args: tuple) -> np.ndarray:
    return corrupt_images(*args)


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    """One pool per worker count for the life of the process: starting workers (and importing OpenCV,
    scikit-image and numba in each) costs seconds, which 75 corrupted splits would otherwise pay 75 times."""
    if workers not in _POOLS:
        _POOLS[workers] = ProcessPoolExecutor(workers)
        atexit.register(_POOLS[workers].shutdown, cancel_futures=True)
    return _POOLS[workers]


def _corrupted_blocks(images: torch.Tensor, name: str, severity: int, seed: int, workers: int, suite: str):
    """``read_blocks`` of a corrupted split: cache-sized blocks, each corrupted by ``workers`` processes."""
    size = images.shape[-1]

    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        pool = _pool(workers) if workers > 1 else None
        for start, end in block_ranges(stop, size):
            block = images[start:end].numpy()
            jobs = [(block[i:i + CHUNK], name, severity, seed, start + i, suite) for i in range(0, len(block), CHUNK)]
            parts = pool.map(_corrupt_job, jobs) if pool else map(_corrupt_job, jobs)
            yield np.concatenate(list(parts))

    return read_blocks


def _official(task: Task, data_cfg, name: str, severity: int, clean: SplitData) -> np.ndarray | None:
    """The task's official corrupted test images (n, 3, S, S) for this severity, or None when it has none."""
    reader = getattr(task, "official_corruption", None)
    found = reader(data_cfg, name, severity, len(clean)) if reader else None
    if found is None:
        return None
    images, labels, path = found
    if not np.array_equal(np.asarray(labels, dtype=np.int64), clean.labels[:, 0].numpy()):
        raise DataError(f"{path}: its labels (labels.npy, severity {severity}) differ from the test split's; "
                        "the file does not belong to this data set's test split.")
    return images


def _clean_digest(images: torch.Tensor) -> str:
    digest = xxhash.xxh3_128()
    for start in range(0, len(images), 4096):
        digest.update(np.ascontiguousarray(images[start:start + 4096].numpy()))
    return digest.hexdigest()


def shift_cache_dir(data_cfg, name: str, severity: int, seed: int, n: int, suite: str = "cifar10c") -> Path:
    return (cache.cache_root(data_cfg) / "shift" / cache.cache_dir(data_cfg).name / suite
            / f"{name}-s{severity}-seed{seed}-n{n}")


def corrupted_split(task: Task, spec: TaskSpec, data_cfg, clean: SplitData, name: str, severity: int, seed: int,
                    workers: int = 0, show_progress: bool = True, suite: str = "cifar10c") -> SplitData:
    """The test split ``clean`` under one corruption and severity of ``suite``: from the cache, built there on
    first use (the official CIFAR-10-C files, where the task has them, are the cifar10c suite)."""
    check_corruption(name, severity)
    if severity == 0:
        return clean
    official = _official(task, data_cfg, name, severity, clean) if suite == "cifar10c" else None
    labels = clean.labels.numpy()
    if official is not None:
        read_blocks = _array_blocks(official)
        origin = "official files"
    else:
        read_blocks = _corrupted_blocks(clean.images, name, severity, seed, workers or default_workers(), suite)
        package = f"imagecorruptions-imaug {importlib.metadata.version('imagecorruptions-imaug')}"
        origin = package if suite == "imagenetc" else f"{suite}: {package} helpers, data/cifar_c.py"
    source = TaskSource(spec, clean.images.shape[-1], {"test": SplitSource(labels, read_blocks, clean.true_probs)})
    if not data_cfg.use_cache:
        return source.splits["test"].decode(source.image_size, desc=f"{name} s{severity}")
    folder = shift_cache_dir(data_cfg, name, severity, seed, len(clean), suite)
    code = hashlib.sha256(Path(__file__).read_bytes() + Path(cifar_c.__file__).read_bytes()).hexdigest()
    fingerprint = {"format": cache.FORMAT_VERSION, "origin": origin, "clean": _clean_digest(clean.images),
                   "corruption": name, "severity": severity, "seed": seed, "suite": suite, "code": code}
    found, problem = cache.inspect_cache(folder, fingerprint)
    if found is None:
        with cache.build_lock(folder, problem, show_progress):
            found, problem = cache.inspect_cache(folder, fingerprint)  # another process may have built it
            if found is None:
                cache.write_source(folder, source, fingerprint, show_progress=show_progress)
                found, problem = cache.inspect_cache(folder, None)
        if found is None:
            raise DataError(f"the corrupted split just written to {folder} does not read back ({problem}).")
    split = found.splits["test"]
    return SplitData(split.images, split.labels, clean.true_probs)


def _array_blocks(images: np.ndarray):
    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        for start, end in block_ranges(stop, images.shape[-1]):
            yield images[start:end]

    return read_blocks
