"""Cross-entropy: the loss of standard training and of COG (both levels)."""

from __future__ import annotations

import torch.nn.functional as F

from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss


@OBJECTIVES.register("ce")
class CrossEntropy(PerTaskLoss):
    def binary_loss(self, z, y):
        return F.binary_cross_entropy_with_logits(z, y, reduction="none")

    def multiclass_loss(self, z, y):
        return F.cross_entropy(z, y)
