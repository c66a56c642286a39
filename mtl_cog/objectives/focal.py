"""Focal loss (Lin et al., 2017; for calibration: Mukhoti et al., 2020)."""

from __future__ import annotations

import torch.nn.functional as F
from torchvision.ops import sigmoid_focal_loss

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss


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
        return sigmoid_focal_loss(z, y, alpha=-1, gamma=self.gamma, reduction="none")

    def multiclass_loss(self, z, y):
        log_p = F.log_softmax(z, dim=1).gather(1, y[:, None]).squeeze(1)
        return (-(1 - log_p.exp()).pow(self.gamma) * log_p).mean()
