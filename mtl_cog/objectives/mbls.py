"""Margin-based label smoothing, MbLS (Liu et al., "The Devil is in the Margins", CVPR 2022).

    loss = CE(z, y) + lambda * mean_j max(0, d_j - m),   d_j = max_k z_k - z_j

The paper writes the penalty as a sum over classes j; the authors' released code (and the plug-in
snippet of their README) takes the *mean* over classes and batch, ``F.relu(diff - margin).mean()``,
and its defaults m = 10, lambda = 0.1 were tuned with that mean. We follow the code. The j of the
largest logit has d_j = 0 and adds nothing for m >= 0.

A binary task (one logit z) is the two-class problem on [0, z]: d = (relu(z), relu(-z)), i.e. one
distance |z| and one 0, so the penalty is max(0, |z| - m) / 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss


def logit_distances(z: torch.Tensor) -> torch.Tensor:
    """(B, K) -> (B, K) distances d_j = max_k z_k - z_j >= 0."""
    return z.amax(dim=1, keepdim=True) - z


def binary_margin_penalty(z: torch.Tensor, margin: float) -> torch.Tensor:
    """(B, Tb) one-logit tasks -> (B, Tb) mean_j max(0, d_j - m) over the two classes of [0, z] (m >= 0)."""
    return F.relu(z.abs() - margin) / 2


def multiclass_margin_penalty(z: torch.Tensor, margin: float) -> torch.Tensor:
    """(B, K) -> (B,) mean_j max(0, d_j - m)."""
    return F.relu(logit_distances(z) - margin).mean(dim=1)


@OBJECTIVES.register("mbls")
class MarginLabelSmoothing(PerTaskLoss):
    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.margin, self.weight = method_cfg.mbls_margin, method_cfg.mbls_lambda

    def binary_loss(self, z, y):
        ce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
        return ce + self.weight * binary_margin_penalty(z, self.margin)

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z, y) + self.weight * multiclass_margin_penalty(z, self.margin).mean()
