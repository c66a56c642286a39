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
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.registry import Registry

OBJECTIVES: Registry[type[nn.Module]] = Registry("loss")


class PerTaskLoss(nn.Module):
    """Base: ``forward(logits (B, L), labels (B, T)) -> (T,)`` per-task mean losses."""

    needs_features: bool = False  # True: forward also takes features=(B, D) backbone features

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__()
        self.layout = layout
        self.register_buffer("binary_columns", layout.binary_columns.clone(), persistent=False)
        self.register_buffer("binary_tasks", torch.tensor(layout.binary_tasks, dtype=torch.long), persistent=False)

    def binary_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """z, y: (B, Tb) logits and {0,1} float targets -> (Tb,) mean over the batch."""
        raise NotImplementedError

    def multiclass_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """z: (B, K) logits, y: (B,) class indices -> scalar mean over the batch."""
        raise NotImplementedError

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.per_task(logits, labels, self.binary_loss, lambda z, y, task: self.multiclass_loss(z, y))

    def per_task(self, logits: torch.Tensor, labels: torch.Tensor, binary_loss: Callable,
                 multiclass_loss: Callable) -> torch.Tensor:
        """(T,) losses: ``binary_loss(z (B, Tb), y (B, Tb))`` for all binary tasks at once, then
        ``multiclass_loss(z (B, K), y (B,), task)`` per K-class task (``task``: its index, for losses
        with per-task parts)."""
        losses = logits.new_zeros(self.layout.num_tasks)
        if len(self.layout.binary_tasks):
            z = logits[:, self.binary_columns]
            y = labels[:, self.binary_tasks].to(z.dtype)
            losses = losses.index_copy(0, self.binary_tasks, binary_loss(z, y))
        for t in self.layout.multiclass_tasks:
            task_loss = multiclass_loss(logits[:, self.layout.task_slice(t)], labels[:, t], t)
            losses = losses.index_copy(0, torch.tensor([t], device=logits.device), task_loss.reshape(1))
        return losses


def build_objective(layout: LogitLayout, method_cfg: MethodConfig) -> PerTaskLoss:
    return OBJECTIVES.get(method_cfg.loss)(layout, method_cfg)
