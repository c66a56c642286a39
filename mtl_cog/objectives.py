"""Training losses on the flat logit layout, returning one loss per task.

COG uses the same loss for leader and follower (paper Sec. 3), so the objective is simply the
method's loss: the mean of the per-task losses (equal task weights, as in the paper's CelebA
setup). Binary tasks are handled together in one fused op over their logit columns; only
multi-class tasks (one in SVHN/CIFAR, none in CelebA) are looped over.

To add a loss: one class with ``@OBJECTIVES.register(name)`` taking ``(layout, method_cfg)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import sigmoid_focal_loss

from mtl_cog.config import MethodConfig
from mtl_cog.registry import Registry
from mtl_cog.task_api import LogitLayout

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


@OBJECTIVES.register("ce")
class CrossEntropy(PerTaskLoss):
    def binary_loss(self, z, y):
        return F.binary_cross_entropy_with_logits(z, y, reduction="none").mean(0)

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z, y)


@OBJECTIVES.register("ls")
class LabelSmoothing(PerTaskLoss):
    """Cross-entropy against smoothed targets (Szegedy et al., 2016): (1-eps)*onehot + eps/K.

    For a binary task this is the 2-class version: targets y*(1-eps) + eps/2.
    """

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.eps = method_cfg.label_smoothing

    def binary_loss(self, z, y):
        target = y * (1 - self.eps) + self.eps / 2
        return F.binary_cross_entropy_with_logits(z, target, reduction="none").mean(0)

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z, y, label_smoothing=self.eps)


@OBJECTIVES.register("focal")
class FocalLoss(PerTaskLoss):
    """Focal loss (Lin et al., 2017; for calibration: Mukhoti et al., 2020).

    Binary tasks use torchvision's sigmoid focal loss without class weighting (alpha < 0);
    multi-class tasks the softmax form -(1 - p_y)^gamma log p_y (no library provides it).
    """

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.gamma = method_cfg.focal_gamma

    def binary_loss(self, z, y):
        return sigmoid_focal_loss(z, y, alpha=-1, gamma=self.gamma, reduction="none").mean(0)

    def multiclass_loss(self, z, y):
        log_p = F.log_softmax(z, dim=1).gather(1, y[:, None]).squeeze(1)
        return (-(1 - log_p.exp()).pow(self.gamma) * log_p).mean()


def build_objective(layout: LogitLayout, method_cfg: MethodConfig) -> PerTaskLoss:
    return OBJECTIVES.get(method_cfg.loss)(layout, method_cfg)
