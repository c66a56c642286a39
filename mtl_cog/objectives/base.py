"""The objective contract: losses on the flat logit layout, returning one loss per task.

COG uses the same loss for leader and follower (paper Sec. 3), so the objective is simply the
method's loss: the mean of the per-task losses (equal task weights, as in the paper's CelebA
setup). Binary tasks are handled together in one fused op over their logit columns; only
multi-class tasks (one in SVHN/CIFAR, none in CelebA) are looped over.

To add a loss: one module in ``mtl_cog/objectives/`` with a ``PerTaskLoss`` subclass registered by
``@OBJECTIVES.register(name)`` (constructor ``(layout, method_cfg)``), imported in ``__init__.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.registry import Registry

OBJECTIVES: Registry[type[nn.Module]] = Registry("loss")


class PerTaskLoss(nn.Module):
    """Base: ``forward(logits (B, L), labels (B, T)) -> (T,)`` per-task mean losses."""

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
        losses = logits.new_zeros(self.layout.num_tasks)
        if len(self.layout.binary_tasks):
            z = logits[:, self.binary_columns]
            y = labels[:, self.binary_tasks].to(z.dtype)
            losses = losses.index_copy(0, self.binary_tasks, self.binary_loss(z, y))
        for t in self.layout.multiclass_tasks:
            task_loss = self.multiclass_loss(logits[:, self.layout.task_slice(t)], labels[:, t])
            losses = losses.index_copy(0, torch.tensor([t], device=logits.device), task_loss.reshape(1))
        return losses


def build_objective(layout: LogitLayout, method_cfg: MethodConfig) -> PerTaskLoss:
    return OBJECTIVES.get(method_cfg.loss)(layout, method_cfg)
