"""The contract between the method (``mtl_cog``) and what to learn (``tasks/``).

``mtl_cog`` never names a data set: it sees a ``TaskSpec`` (task names, classes per task,
normalisation, augmentation) and ``SplitData`` (uint8 images + integer label matrix). A data set
is one module in ``tasks/`` registered with ``@TASKS.register(name)``.

Output layout: every task's logits live side by side in one flat ``(B, L)`` tensor so that all
heads and calibrators run as batched tensor ops. A binary task (2 classes) owns one column (a
single logit z, p = sigmoid(z)); a K-class task owns K columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

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
        if len(self.task_names) != len(self.num_classes):
            raise ValueError("task_names and num_classes must have the same length.")
        if any(k < 2 for k in self.num_classes):
            raise ValueError(f"every task needs at least 2 classes, got {self.num_classes}.")

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
        """The first ``n`` samples (``data.max_samples``)."""
        if n is None or n >= len(self):
            return self
        probs = None if self.true_probs is None else self.true_probs[:n]
        return SplitData(self.images[:n], self.labels[:n], probs)


@dataclass
class TaskData:
    spec: TaskSpec
    splits: dict[str, SplitData] = field(default_factory=dict)


class Task(Protocol):
    """What a ``tasks/<name>.py`` module registers.

    ``load(data_cfg)`` returns the train/val/test splits as uint8 tensors (already resized to
    ``data_cfg.image_size``), honouring ``data_cfg.max_samples``. ``source_files(data_cfg)`` lists
    the files it reads (for cache fingerprints); a generated task returns [].
    """

    def load(self, data_cfg) -> TaskData: ...

    def source_files(self, data_cfg) -> list[Path]: ...

    # Optional: ``split_sizes(data_cfg) -> {"train": n, "val": n, "test": n}`` without loading
    # anything (dry runs estimate run times from it); see ``capped_sizes``.


def capped_sizes(sizes: dict[str, int], max_samples: int | None) -> dict[str, int]:
    """Split sizes after ``data.max_samples`` (the first N of each split)."""
    return {split: n if max_samples is None else min(n, max_samples) for split, n in sizes.items()}


TASKS: Registry[Task] = Registry("task")
