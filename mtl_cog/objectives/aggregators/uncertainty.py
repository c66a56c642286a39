"""Uncertainty weighting (Kendall, Gal & Cipolla, CVPR 2018): task weights from learned log-variances.

Each task t has a learned s_t = log sigma_t^2 and the objective is

    sum_t exp(-s_t) L_t + s_t / 2,

Kendall et al.'s classification form (their Eq. 10-12: a softmax whose logits are scaled by
1/sigma^2 has likelihood ~ (1/sigma^2) L + log sigma). A binary task is a two-class softmax with
one logit, so its form is the same; only regression would carry the extra 1/2 of
``torchjd.scalarization.UW`` (1/(2 sigma^2) L + log sigma), which is why that class is not used
here. At s_t = 0 every weight is 1. For fixed L_t the optimum is exp(-s_t) = 1 / (2 L_t): a task
with a large loss is down-weighted.

Under this project's gradient rule (``docs/guides/mtl.md``) the weights exp(-s_t) scale the *backbone's*
gradient only; the heads (and the COG leader) keep the mean loss's gradient. The log-variances
learn from ``penalty`` = sum_t exp(-s_t) L_t.detach() + s_t / 2 over the tasks labelled in the
batch, so d/ds_t = -exp(-s_t) L_t + 1/2 exactly as in the paper, and a task without a label in the
batch leaves its s_t alone (its L_t = 0 would otherwise drive s_t up without bound). They sit in
the optimiser's ``objective`` group (follower rate), averaged over processes, saved with the state.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.objectives.aggregators.base import AGGREGATORS, TaskAggregator


@AGGREGATORS.register("uncertainty")
class UncertaintyWeighting(TaskAggregator):
    needs_gramian = False

    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks)
        self.log_variance = nn.Parameter(torch.zeros(num_tasks))  # s_t = log sigma_t^2; 0: every weight 1

    def weights(self, gramian: torch.Tensor | None, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return torch.exp(-self.log_variance.detach()).to(torch.float64) * present

    def penalty(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        s = self.log_variance
        terms = torch.exp(-s) * losses.detach().to(s.dtype) + s / 2
        return torch.where(present, terms, torch.zeros_like(terms)).sum()
