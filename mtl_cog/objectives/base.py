"""The objective contract: losses on the flat logit layout, returning one loss per task.

COG uses the same loss for leader and follower (paper Sec. 3), so the objective is simply the
method's loss: the mean of the per-task losses (equal task weights, as in the paper's CelebA
setup). Binary tasks are handled together in one fused op over their logit columns; only
multi-class tasks (one in SVHN/CIFAR, none in CelebA) are looped over.

To add a loss: one module in ``mtl_cog/objectives/`` with a ``PerTaskLoss`` subclass registered by
``@OBJECTIVES.register(name)`` (constructor ``(layout, method_cfg)``), imported in ``__init__.py``.

A loss that needs the backbone's pooled features (FedLAS's feature-norm indicator, the margin-aware
objective's feature-space slope) sets ``needs_features = True``: the training step then runs the
network with ``with_features=True`` and calls ``objective(logits, labels, features=features)``.
A loss may own parameters (FedLAS's gate): ``mtl_cog.training.optim`` puts them in their own
optimiser group, and the training state saves the objective's parameters and buffers.

Partly labelled data: a label equal to ``MISSING_LABEL`` (-100, PyTorch's ``ignore_index``
convention) is unknown. Each task's loss is then the mean over the samples labelled *for that
task* only, exactly the loss on that labelled subset (``tests/test_partial_labels.py``); a task
without a labelled sample in the batch contributes 0 and no gradient. ``binary_loss`` therefore
returns per-sample losses (B, Tb) and the base class reduces them (``.mean(0)`` when every label is
known: the same op as before, so fully labelled data trains bit for bit as it always did).
``partial_labels`` says whether to look for missing labels: ``None`` (the default) looks at every
batch (one device-to-host sync), ``False``/``True`` are set by the training loop from the data set,
so fully labelled data never pays for the look.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mtl_cog.config import MethodConfig
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.registry import Registry

OBJECTIVES: Registry[type[nn.Module]] = Registry("loss")


class PerTaskLoss(nn.Module):
    """Base: ``forward(logits (B, L), labels (B, T)) -> (T,)`` per-task mean losses over labelled samples."""

    needs_features: bool = False  # True: forward also takes features=(B, D) backbone features
    partial_labels: bool | None = None  # None: look for MISSING_LABEL in every batch; False/True: known

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__()
        self.layout = layout
        self.register_buffer("binary_columns", layout.binary_columns.clone(), persistent=False)
        self.register_buffer("binary_tasks", torch.tensor(layout.binary_tasks, dtype=torch.long), persistent=False)

    def binary_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """z, y: (B, Tb) logits and {0,1} float targets -> (B, Tb) per-sample losses."""
        raise NotImplementedError

    def multiclass_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """z: (B, K) logits, y: (B,) class indices -> scalar mean over the batch."""
        raise NotImplementedError

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.per_task(logits, labels, self.binary_loss, lambda z, y, task, rows: self.multiclass_loss(z, y))

    def has_missing(self, labels: torch.Tensor) -> bool:
        if self.partial_labels is None:
            return bool((labels == MISSING_LABEL).any())
        return self.partial_labels

    def per_task(self, logits: torch.Tensor, labels: torch.Tensor, binary_loss: Callable,
                 multiclass_loss: Callable) -> torch.Tensor:
        """(T,) losses: ``binary_loss(z (B, Tb), y (B, Tb)) -> (B, Tb)`` for all binary tasks at once (reduced
        here over each task's labelled samples), then ``multiclass_loss(z (n, K), y (n,), task, rows)`` per K-class
        task on its n labelled samples (``task``: its index, for losses with per-task parts; ``rows``: the (B,)
        mask of those samples, or None when all are, for losses with per-sample inputs of their own)."""
        losses = logits.new_zeros(self.layout.num_tasks)
        masked = self.has_missing(labels)
        if len(self.layout.binary_tasks):
            z = logits[:, self.binary_columns]
            y = labels[:, self.binary_tasks]
            if masked:
                known = y != MISSING_LABEL
                per_sample = binary_loss(z, torch.where(known, y, 0).to(z.dtype))
                reduced = labelled_mean(per_sample, known)
            else:
                reduced = binary_loss(z, y.to(z.dtype)).mean(0)
            losses = losses.index_copy(0, self.binary_tasks, reduced)
        for t in self.layout.multiclass_tasks:
            z, y, rows = logits[:, self.layout.task_slice(t)], labels[:, t], None
            if masked:
                rows = y != MISSING_LABEL
                z, y = z[rows], y[rows]
            # no labelled sample of this task in the batch: 0, with no gradient (an empty sum, in the graph)
            task_loss = multiclass_loss(z, y, t, rows) if len(y) else z.sum()
            losses = losses.index_copy(0, torch.tensor([t], device=logits.device), task_loss.reshape(1))
        return losses


def labelled_mean(values: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """(B, T) per-sample values -> (T,) means over each column's ``known`` rows (0 for a column with none).

    Unknown entries are replaced, not multiplied, by 0: a loss evaluated at a placeholder label may
    be inf or NaN there, and 0 * NaN would poison the column.
    """
    count = known.sum(0).clamp(min=1).to(values.dtype)
    return torch.where(known, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum(0) / count


def known_labels(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels with every ``MISSING_LABEL`` replaced by class 0, the (B, T) mask of known entries): for losses
    that compute per-sample terms from the labels themselves (margins) before ``labelled_mean``."""
    known = labels != MISSING_LABEL
    return torch.where(known, labels, 0), known


def set_partial_labels(objective: nn.Module, partial: bool) -> None:
    """Tell every per-task loss inside ``objective`` whether the data has missing labels (no per-batch look)."""
    for module in objective.modules():
        if isinstance(module, PerTaskLoss):
            module.partial_labels = partial


def build_objective(layout: LogitLayout, method_cfg: MethodConfig) -> PerTaskLoss:
    return OBJECTIVES.get(method_cfg.loss)(layout, method_cfg)
