"""A loss plus a term the head itself contributes (the KL divergence of V-TST's variational head)."""

from __future__ import annotations

import torch
from torch import nn


class WithAuxiliaryLoss(nn.Module):
    """The run's per-task losses (T,) plus ``weight * head.auxiliary_loss()`` (T,), task by task.

    For V-TST's head, task t's term is the KL of task t's latent (batch mean of sum_d KL_d / Z),
    so after the training step's mean over tasks each task's head minimises its NLL + KL / Z,
    the authors' single-task objective (weight 1), scaled by 1/T like every task's loss. A head
    without such a term returns 0, which leaves the losses unchanged.
    """

    def __init__(self, objective: nn.Module, heads: nn.Module, weight: float) -> None:
        super().__init__()
        self.objective, self.heads, self.weight = objective, heads, weight

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.objective(logits, labels) + self.weight * self.heads.auxiliary_loss()
