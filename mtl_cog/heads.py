"""Task heads: backbone features (B, D) -> flat logits (B, L) for all tasks at once.

All tasks are computed in one batched op (one matmul for ``linear``), never a Python loop over
tasks: with 40 CelebA heads a loop would dominate the step time of a small backbone.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.registry import Registry
from mtl_cog.task_api import LogitLayout

HEADS: Registry[type[nn.Module]] = Registry("head")


@HEADS.register("linear")
class LinearHeads(nn.Module):
    """One linear classifier per task, stored as one (L, D) weight: heads = the final FC layer."""

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, layout.total)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)
