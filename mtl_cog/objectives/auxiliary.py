"""A loss plus a term the head itself contributes (the KL divergence of V-TST's variational head)."""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.objectives.base import labelled_mean


class WithAuxiliaryLoss(nn.Module):
    """The run's per-task losses (T,) plus ``weight * head.auxiliary_loss()`` (T,), task by task.

    For V-TST's head, task t's term is the KL of task t's latent (batch mean of sum_d KL_d / Z),
    so after the training step's mean over tasks each task's head minimises its NLL + KL / Z,
    the authors' single-task objective (weight 1), scaled by 1/T like every task's loss. A head
    without such a term (``auxiliary_terms()`` None) leaves the losses unchanged. Partly labelled
    data: task t's term is averaged over the samples labelled for t, like its loss.
    """

    def __init__(self, objective: nn.Module, heads: nn.Module, weight: float) -> None:
        super().__init__()
        self.objective, self.weight = objective, weight
        # a bound method, not a sub-module: the heads are the network's, and the loss's own state
        # (saved in the training state next to the network's) must not hold them a second time
        self.auxiliary_terms = heads.auxiliary_terms

    @property
    def needs_features(self) -> bool:
        return getattr(self.objective, "needs_features", False)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
        losses = self.objective(logits, labels, **inputs)
        terms = self.auxiliary_terms()  # (B, T) or None
        if terms is None:
            return losses
        # partly labelled data: task t's term over the samples labelled for t, like its loss (a fully
        # labelled batch takes the plain mean, bit for bit as before)
        masked = self.objective.has_missing(labels)
        return losses + self.weight * (labelled_mean(terms, labels != MISSING_LABEL) if masked else terms.mean(0))
