"""The network of two-stage training, TST and V-TST (Jordahn & Olmos, 2024), as the COG paper compares with.

Stage one is ordinary training. Stage two keeps the backbone fixed, puts a new head on it
(``two_stage.head``: ``mlp`` for TST, ``variational`` for V-TST) and trains only that head with
the run's loss, plus V-TST's per-task KL term (the loop is ``mtl_cog.training.loop``; the
authors' stage-two settings are the defaults of ``TwoStageConfig``, differences in
docs/explanation/baselines.md). The frozen backbone stays in eval mode throughout: in train mode BatchNorm
would keep updating its running statistics (the original TST code has this quirk), i.e. stage
one would be silently retrained.

A stochastic head is evaluated by averaging the *probabilities* of ``two_stage.mc_samples``
forwards; prediction files hold logits, so the network returns the logits of the averaged
probabilities (log p for a K-class task, log p - log(1 - p) for a binary one).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mtl_cog.config import TwoStageConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.heads import HEADS
from mtl_cog.models.network import Network


def mean_probability_logits(samples: torch.Tensor, layout: LogitLayout) -> torch.Tensor:
    """(S, B, L) logits of S samples -> (B, L) logits whose probabilities are the sample mean.

    Computed in log space (logsumexp) so that confident samples do not underflow.
    """
    log_s = math.log(samples.shape[0])
    out = torch.empty_like(samples[0])
    if layout.binary_tasks:
        cols = layout.binary_columns.to(samples.device)
        z = samples[:, :, cols]
        log_p = torch.logsumexp(nn.functional.logsigmoid(z), 0) - log_s
        log_q = torch.logsumexp(nn.functional.logsigmoid(-z), 0) - log_s
        out[:, cols] = log_p - log_q
    for t in layout.multiclass_tasks:  # one per single-task data set, none in CelebA
        block = layout.task_slice(t)
        out[:, block] = torch.logsumexp(torch.log_softmax(samples[:, :, block], -1), 0) - log_s
    return out


class TwoStageNetwork(nn.Module):
    """The stage-one backbone (frozen, always in eval mode) -> a new head -> the frozen calibrator.

    Same sub-module names as ``Network``, so checkpoints and parameter counts read alike.
    """

    def __init__(self, backbone: nn.Module, heads: nn.Module, calibrator: nn.Module, layout: LogitLayout,
                 mc_samples: int) -> None:
        super().__init__()
        self.backbone, self.heads, self.calibrator = backbone, heads, calibrator
        self.layout, self.mc_samples = layout, mc_samples
        for module in (self.backbone, self.calibrator):
            module.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> TwoStageNetwork:
        super().train(mode)
        self.backbone.eval()  # BatchNorm statistics and dropout of stage one stay fixed
        return self

    def forward(self, images: torch.Tensor, with_features: bool = False):
        with torch.no_grad():
            features = self.backbone(images)
        if with_features:  # a loss on the features (e.g. their slope) differentiates w.r.t. them, not the backbone
            features = features.requires_grad_(self.training)
        if self.training or not getattr(self.heads, "stochastic", False):
            logits = self.calibrator(self.heads(features))
        else:
            samples = torch.stack([self.calibrator(self.heads(features)) for _ in range(self.mc_samples)])
            logits = mean_probability_logits(samples, self.layout)
        return (features, logits) if with_features else logits

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self(images, with_features=True)


def attach_second_stage_head(network: Network, cfg: TwoStageConfig, layout: LogitLayout) -> TwoStageNetwork:
    """Stage one's backbone and calibrator with a freshly initialised ``cfg.head``."""
    in_features = network.backbone.num_features
    heads = HEADS.get(cfg.head)(in_features, layout, latent_dim=cfg.latent_dim)
    device = next(network.parameters()).device
    return TwoStageNetwork(network.backbone, heads.to(device), network.calibrator, layout, cfg.mc_samples)
