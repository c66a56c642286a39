"""The contract between the method (``mtl_cog``) and what to learn (``tasks/``).

``mtl_cog`` never names a data set: it sees a ``TaskSpec`` (task names, classes per task,
normalisation, augmentation) and ``SplitData`` (uint8 images + integer label matrix). A data set
is one module in ``tasks/`` registered with ``@TASKS.register(name)`` and listed in
``tasks/__init__.py``; ``TASKS`` imports that package on its first lookup, the one place where the
data sets are registered.

Streaming: a task's ``open(data_cfg)`` returns a ``TaskSource`` (spec, labels, and per split a
``read_blocks`` generator that decodes images in blocks of at most ``IMAGE_BLOCK_BYTES``). The
cache writer (``mtl_cog.data.cache``) streams those blocks to disk, so building a cache needs
the same memory for 2,000 images as for 202,599; ``TaskSource.decode`` reads them into memory
when no cache is wanted.

Output layout: every task's logits live side by side in one flat ``(B, L)`` tensor so that all
heads and calibrators run as batched tensor ops. A binary task (2 classes) owns one column (a
single logit z, p = sigmoid(z)); a K-class task owns K columns.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil
import torch
from tqdm.auto import tqdm

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.errors import ConfigError, DataError
from mtl_cog.registry import Registry


@dataclass(frozen=True)
class TaskSpec:
    dataset: str
    task_names: tuple[str, ...]
    num_classes: tuple[int, ...]
    mean: tuple[float, float, float]  # per channel, on the [0, 1] scale
    std: tuple[float, float, float]
    pad_crop: int = 0  # train augmentation: pad by this many pixels then random-crop back; 0 = off
    hflip: bool = False  # train augmentation: random horizontal flip

    def __post_init__(self) -> None:
        """Types, ranges and uniqueness, whoever builds the spec (a task's reader, a cache, ``task_spec.json``).

        Every field flows into numbers: a task named twice reports one task's metrics under
        another's name (and a dict keyed by name silently drops one), a std of 0, negative or NaN
        makes every input inf/NaN, a mean outside [0, 1] (the scale images are divided to) shifts
        every probability. So each is refused here with a ``DataError`` naming the field.
        """
        where = f"task spec of data set {self.dataset!r}"
        if not isinstance(self.task_names, tuple) or not self.task_names:
            raise DataError(f"{where}: task_names must be a non-empty list of names, got {self.task_names!r}.")
        bad = [n for n in self.task_names if not isinstance(n, str) or not n.strip()]
        if bad:
            raise DataError(f"{where}: every task name must be a non-empty string, got {bad[:3]!r}.")
        twice = sorted({n for n in self.task_names if self.task_names.count(n) > 1})
        if twice:
            raise DataError(f"{where}: task name(s) {twice} appear more than once; each task needs its own name.")
        if not isinstance(self.num_classes, tuple) or len(self.task_names) != len(self.num_classes):
            raise DataError(f"{where}: task_names and num_classes must have the same length.")
        if any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 2 for k in self.num_classes):
            raise DataError(f"{where}: every task needs an integer number of classes >= 2, got {self.num_classes}.")
        for name, values, low in (("mean", self.mean, None), ("std", self.std, 0.0)):
            ok = isinstance(values, tuple) and len(values) == 3 and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) for v in values)
            if not ok or (min(values) <= low if low is not None else not 0 <= min(values) <= max(values) <= 1):
                rule = "> 0" if low is not None else "in [0, 1]"
                raise DataError(f"{where}: {name} must be 3 finite per-channel values {rule} (images are on the "
                                f"[0, 1] scale), got {values!r}.")
        if isinstance(self.pad_crop, bool) or not isinstance(self.pad_crop, numbers.Integral) or self.pad_crop < 0:
            raise DataError(f"{where}: pad_crop must be an integer >= 0, got {self.pad_crop!r}.")
        if not isinstance(self.hflip, (bool, np.bool_)):
            raise DataError(f"{where}: hflip must be true or false, got {self.hflip!r}.")

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @cached_property
    def layout(self) -> LogitLayout:
        return LogitLayout(self.num_classes)


class LogitLayout:
    """Where each task's logits sit in the flat ``(B, L)`` output."""

    def __init__(self, num_classes: tuple[int, ...]) -> None:
        self.num_classes = tuple(num_classes)
        self.widths = tuple(1 if k == 2 else k for k in self.num_classes)
        self.offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.widths)[:-1]]))
        self.total = int(sum(self.widths))
        self.binary_tasks = tuple(t for t, k in enumerate(self.num_classes) if k == 2)
        self.multiclass_tasks = tuple(t for t, k in enumerate(self.num_classes) if k > 2)
        # column -> task index, used to broadcast per-task parameters (e.g. temperatures)
        self.column_task = torch.tensor(
            [t for t, w in enumerate(self.widths) for _ in range(w)], dtype=torch.long
        )
        self.binary_columns = torch.tensor([self.offsets[t] for t in self.binary_tasks], dtype=torch.long)

    @property
    def num_tasks(self) -> int:
        return len(self.num_classes)

    def task_slice(self, task: int) -> slice:
        return slice(self.offsets[task], self.offsets[task] + self.widths[task])

    def split(self, logits: np.ndarray | torch.Tensor) -> list:
        """Flat (N, L) -> list of per-task logits: (N,) for binary, (N, K) for multi-class."""
        out = []
        for t, width in enumerate(self.widths):
            block = logits[:, self.offsets[t] : self.offsets[t] + width]
            out.append(block[:, 0] if width == 1 else block)
        return out

    def join(self, per_task: list) -> np.ndarray:
        """Inverse of ``split`` for numpy arrays."""
        cols = [np.asarray(x).reshape(len(x), -1) for x in per_task]
        return np.concatenate(cols, axis=1)


@dataclass
class SplitData:
    """One decoded split: uint8 images and the integer label matrix (in memory or memory-mapped)."""

    images: torch.Tensor  # uint8, (N, 3, H, W)
    labels: torch.Tensor  # int64, (N, T)
    true_probs: np.ndarray | None = None  # (N, T) P(y_t = 1 | x) for binary tasks, where known

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {self.images.dtype} {tuple(self.images.shape)}.")
        if self.labels.ndim != 2 or len(self.labels) != len(self.images):
            raise ValueError(
                f"labels must be (N, T) with N = {len(self.images)}, got {tuple(self.labels.shape)}."
            )

    def __len__(self) -> int:
        return len(self.images)

    def head(self, n: int | None) -> SplitData:
        """The first ``n`` samples (``data.max_samples``): views, nothing is copied."""
        if n is None or n >= len(self):
            return self
        probs = None if self.true_probs is None else self.true_probs[:n]
        return SplitData(self.images[:n], self.labels[:n], probs)

    def subset(self, n: int | None, seed: int = 0) -> SplitData:
        """``n`` samples drawn without replacement by ``seed`` (``data.train_size``), kept in their order.

        The draw is the first ``n`` of one fixed permutation of the split, so a smaller subset is
        part of every larger one (2,500 training images are among the 5,000): a training-size series
        adds images and never swaps them. Independent of the training seed, so every run of a campaign
        trains on the same images. Copies the chosen images (a memory-mapped cache is read once).
        """
        if n is None or n >= len(self):
            return self
        order = np.random.default_rng(seed).permutation(len(self))[:n]
        keep = torch.from_numpy(np.sort(order))
        probs = None if self.true_probs is None else self.true_probs[keep.numpy()]
        return SplitData(self.images[keep], self.labels[keep], probs)


@dataclass
class TaskData:
    spec: TaskSpec
    splits: dict[str, SplitData] = field(default_factory=dict)

    def head(self, n: int | None) -> TaskData:
        """Every split cut to its first ``n`` samples (``data.max_samples``): a slice of the full data."""
        return TaskData(self.spec, {name: split.head(n) for name, split in self.splits.items()})


# ------------------------------------------------------------------------ before decoding: sources

# Images are handed over in blocks of at most this many bytes, so that whoever consumes them (the
# cache writer, ``TaskSource.decode``) needs memory for one block, not for the split: 202,599
# CelebA images at 128 px are 10 GB, a block is 32 MiB (682 of them).
IMAGE_BLOCK_BYTES = 32 * 2**20

# ``read_blocks(stop)``: the first ``stop`` images of a split as consecutive uint8 (n, 3, S, S) blocks.
ReadBlocks = Callable[[int], Iterator[np.ndarray]]


def block_length(image_size: int) -> int:
    """Images per block at ``image_size`` (see ``IMAGE_BLOCK_BYTES``)."""
    return max(1, IMAGE_BLOCK_BYTES // (3 * image_size * image_size))


def block_ranges(stop: int, image_size: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` ranges of ``block_length(image_size)`` images covering ``range(stop)``.

    Boundaries are multiples of the block length whatever ``stop`` is, so a reader that processes
    whole blocks produces the same image ``i`` for every ``stop`` (a capped read is a prefix).
    """
    step = block_length(image_size)
    for start in range(0, stop, step):
        yield start, min(start + step, stop)


@dataclass
class SplitSource:
    """One split before its images are decoded: labels in memory, images decoded block by block.

    ``read_blocks(stop)`` yields the first ``stop`` images as consecutive uint8 ``(n, 3, S, S)``
    blocks of at most ``block_length(S)`` images (``block_ranges`` gives the boundaries). Image
    ``i`` must not depend on ``stop``, and every call starts afresh from image 0.
    """

    labels: np.ndarray  # (N, T) integers
    read_blocks: ReadBlocks
    true_probs: np.ndarray | None = None  # (N, T) float, see SplitData

    def __len__(self) -> int:
        return len(self.labels)

    def decode(self, image_size: int, n: int | None = None, desc: str = "") -> SplitData:
        """The first ``n`` (default all) samples decoded into one in-memory ``SplitData``."""
        n = len(self) if n is None else min(n, len(self))
        images = np.empty((n, 3, image_size, image_size), dtype=np.uint8)
        filled = 0
        with tqdm(total=n, desc=desc or "decoding", unit="img", disable=n < 5000, leave=False) as bar:
            for block in self.read_blocks(n):
                if filled + len(block) > n or tuple(block.shape[1:]) != images.shape[1:]:
                    raise DataError(f"{desc or 'a split'}: the reader produced a block of shape {block.shape} "
                                    f"after {filled} images; expected {n} images of shape {images.shape[1:]}.")
                images[filled : filled + len(block)] = block
                filled += len(block)
                bar.update(len(block))
        if filled != n:
            raise DataError(f"{desc or 'a split'}: the reader produced {filled} images, its labels say {n}.")
        probs = None if self.true_probs is None else np.asarray(self.true_probs[:n], dtype=np.float32)
        labels = torch.from_numpy(np.ascontiguousarray(self.labels[:n], dtype=np.int64))
        return SplitData(torch.from_numpy(images), labels, probs)


@dataclass
class TaskSource:
    """What ``Task.open`` returns: the spec, the image size and each split's ``SplitSource``.

    Construction checks every split's labels against the spec (``check_labels``), so out-of-range
    labels stop a build before anything is decoded, whichever task produced them.
    """

    spec: TaskSpec
    image_size: int
    splits: dict[str, SplitSource]

    def __post_init__(self) -> None:
        for name, split in self.splits.items():
            check_labels(self.spec, split.labels, f"task {self.spec.dataset!r}, split {name!r}")
            if split.true_probs is not None:
                check_true_probs(split.true_probs, len(split), self.spec.num_tasks,
                                 f"task {self.spec.dataset!r}, split {name!r}")

    def decode(self, max_samples: int | None = None) -> TaskData:
        """Everything (or the first ``max_samples`` of each split) decoded into memory: no cache."""
        splits = {name: split.decode(self.image_size, max_samples, desc=f"{self.spec.dataset} {name}")
                  for name, split in self.splits.items()}
        return TaskData(self.spec, splits)

    @classmethod
    def from_task_data(cls, data: TaskData) -> TaskSource:
        """A source over already decoded splits (tests, benchmarks: anything that holds tensors)."""
        sizes = {tuple(split.images.shape[-2:]) for split in data.splits.values()}
        if len(sizes) != 1 or len(next(iter(sizes))) != 2 or len(set(next(iter(sizes)))) != 1:
            raise ValueError(f"every split needs square images of one size, got {sorted(sizes)}.")
        size = next(iter(sizes))[0]

        def blocks_of(images: torch.Tensor) -> ReadBlocks:
            def read_blocks(stop: int) -> Iterator[np.ndarray]:
                for start, end in block_ranges(stop, size):
                    yield images[start:end].cpu().numpy()
            return read_blocks

        splits = {name: SplitSource(split.labels.cpu().numpy(), blocks_of(split.images), split.true_probs)
                  for name, split in data.splits.items()}
        return cls(data.spec, size, splits)


def check_labels(spec: TaskSpec, labels: np.ndarray, where: str) -> None:
    """Refuse a label matrix that is not (N, T) integers with column t in ``0 .. num_classes[t] - 1``."""
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[1] != spec.num_tasks:
        raise DataError(f"{where}: labels must be an (N, {spec.num_tasks}) matrix, got shape {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers, got {labels.dtype}.")
    if not len(labels):
        return
    limits = np.asarray(spec.num_classes)
    missing = labels == MISSING_LABEL  # partly labelled data: this entry is unknown (mtl_cog/constants.py)
    known_min = np.where(missing, 0, labels).min(axis=0)
    bad_columns = np.flatnonzero((known_min < 0) | (labels.max(axis=0) >= limits))
    if bad_columns.size:
        t = int(bad_columns[0])
        column = labels[:, t]
        row = int(np.flatnonzero(((column < 0) & (column != MISSING_LABEL)) | (column >= limits[t]))[0])
        value = int(column[row])
        hint = (f" A negative label usually marks an unknown value: write it as {MISSING_LABEL} (MISSING_LABEL), "
                "never as another negative value (CelebA's files use -1 for 'no')." if value < 0 else "")
        raise DataError(
            f"{where}: task {spec.task_names[t]!r} has label {value} at row {row}; its labels must lie in "
            f"0..{int(limits[t]) - 1} or be {MISSING_LABEL} (missing).{hint}"
        )
    unlabelled = np.flatnonzero(missing.all(axis=0))
    if unlabelled.size:  # nothing to train, select or score this task on
        names = ", ".join(repr(spec.task_names[t]) for t in unlabelled[:5])
        raise DataError(f"{where}: task(s) {names} have no labelled sample (every label is {MISSING_LABEL}); "
                        "give each task at least one label in every split, or drop the task.")


def check_true_probs(true_probs: np.ndarray, n: int, num_tasks: int, where: str) -> None:
    """Refuse true probabilities that are not an (N, T) array of finite values in [0, 1]."""
    probs = np.asarray(true_probs)
    if probs.shape != (n, num_tasks):
        raise DataError(f"{where}: true probabilities must have shape {(n, num_tasks)}, got {probs.shape}.")
    if probs.size and not (np.isfinite(probs).all() and probs.min() >= 0 and probs.max() <= 1):
        raise DataError(f"{where}: true probabilities must be finite and lie in [0, 1].")


class Task(Protocol):
    """What a ``tasks/<name>.py`` module registers.

    ``open(data_cfg)`` reads what is small (label and index files; small data sets entirely),
    validates it and returns a ``TaskSource`` whose splits decode their images block by block at
    ``data_cfg.image_size``; it ignores ``data_cfg.max_samples`` (callers take a prefix, so one
    cache serves every cap). ``source_files(data_cfg)`` lists the files it reads (for cache
    fingerprints); a generated task returns [].
    """

    def open(self, data_cfg) -> TaskSource: ...

    def source_files(self, data_cfg) -> list[Path]: ...

    # Optional, without loading anything (dry runs estimate run times from them):
    # ``split_sizes(data_cfg) -> {"train": n, "val": n, "test": n}`` (see ``capped_sizes``) and
    # ``num_tasks(data_cfg) -> int`` (scoring an evaluation costs time per task).


def capped_sizes(sizes: dict[str, int], max_samples: int | None) -> dict[str, int]:
    """Split sizes after ``data.max_samples`` (the first N of each split)."""
    return {split: n if max_samples is None else min(n, max_samples) for split, n in sizes.items()}


def trained_sizes(sizes: dict[str, int], train_size: int | None, task: str = "") -> dict[str, int]:
    """A task's ``split_sizes`` after ``data.train_size`` (the training images kept; ``loading.load_task``), refused
    where the split is smaller, as the run itself would refuse it (dry runs say so before any run starts)."""
    if train_size is not None and train_size > sizes["train"]:
        raise ConfigError(too_few_training_images(train_size, sizes["train"], task))
    return {**sizes, "train": sizes["train"] if train_size is None else train_size}


def too_few_training_images(train_size: int, available: int, task: str) -> str:
    return (f"data.train_size={train_size} is more than the {available:,} training images of {task!r} (after "
            f"data.max_samples, if set); use at most {available} or null (all).")


TASKS: Registry[Task] = Registry("task", plugins="tasks")  # the built-in data sets, imported on first lookup


def check_generation_memory(samples: int, per_sample: int, image_size: int, use_cache: bool, what: str) -> None:
    """Refuse sizes a generated data set cannot be built in, before allocating (else a ``MemoryError`` traceback).

    ``per_sample``: the bytes a task's generation holds per sample at once (its latents, layouts,
    labels); the images (3 x S x S bytes each) come on top when they are decoded into memory
    instead of a cache (``data.use_cache=false``). ``what`` names the config section in the message.
    """
    needed = samples * (per_sample + (0 if use_cache else 3 * image_size ** 2))
    available = psutil.virtual_memory().available
    if needed > available:
        raise ConfigError(
            f"{what}: {samples:,} samples (train_size + val_size + test_size) need about {needed / 2**30:,.1f} GiB of "
            f"memory to generate, more than the {available / 2**30:.1f} GiB available. Choose smaller sizes."
        )
