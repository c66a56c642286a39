"""Cross-entropy with a logit margin: the training loss of LiST (Lipschitz Scaling Training).

    loss = CE(z - m * e_y, y)        (binary task on [0, z]: logistic loss of z - m (2y - 1))

The true class's logit is lowered by m during training only, so the loss keeps pushing until the
true logit leads every other by about m. For a Lipschitz network (``mtl_cog.models.lipschitz``) a
logit lead is a certified radius (lead / (sqrt(2) L), ``mtl_cog.evaluation.robustness``), so m
trades accuracy for robustness; LiST's abstract uses this margin to trace a calibrated
accuracy-robustness front, with L re-calibrated along it. Our choice: m is in logit units (of z,
after L), the usual form of margin cross-entropy for Lipschitz networks (Tsuzuku et al., 2018,
add the margin to the logits). m = 0 is cross-entropy.
"""

from __future__ import annotations

import torch.nn.functional as F

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss


@OBJECTIVES.register("margin_ce")
class MarginCrossEntropy(PerTaskLoss):
    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.margin = method_cfg.list_margin

    def binary_loss(self, z, y):
        return F.binary_cross_entropy_with_logits(z - self.margin * (2 * y - 1), y, reduction="none")

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z - self.margin * F.one_hot(y, z.shape[1]).to(z.dtype), y)
