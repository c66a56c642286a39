"""Label smoothing (Szegedy et al., 2016): the loss of LS and of COG+LS (both levels)."""

from __future__ import annotations

import torch.nn.functional as F

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss


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
        return F.binary_cross_entropy_with_logits(z, target, reduction="none")

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z, y, label_smoothing=self.eps)
