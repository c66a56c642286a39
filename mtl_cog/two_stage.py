"""Two-stage training, TST and V-TST (Jordahn & Olmos, 2024), as the COG paper compares with.

Stage one is ordinary training (the run's own loop). Stage two keeps the backbone fixed, puts a
new head on it (``two_stage.head``: ``mlp`` for TST, ``variational`` for V-TST) and trains only
that head with the run's loss, early-stopped on validation NLL. The frozen backbone stays in
eval mode throughout: in train mode BatchNorm would keep updating its running statistics
(DESIGN.md §8; the original TST code has this quirk), i.e. stage one would be silently retrained.

A stochastic head is evaluated by averaging the *probabilities* of ``two_stage.mc_samples``
forwards; prediction files hold logits, so the network returns the logits of the averaged
probabilities (log p for a K-class task, log p - log(1 - p) for a binary one).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from mtl_cog import rundir
from mtl_cog.checkpoint import save_model
from mtl_cog.config import TrainConfig, TwoStageConfig
from mtl_cog.data import BatchTransform
from mtl_cog.engine import train_one_epoch
from mtl_cog.evaluation import predict_split, score
from mtl_cog.heads import HEADS
from mtl_cog.io import append_jsonl, atomic_write_json
from mtl_cog.models import Network, parameter_counts
from mtl_cog.task_api import LogitLayout, SplitData, TaskSpec


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

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(images)
        if self.training or not getattr(self.heads, "stochastic", False):
            return self.calibrator(self.heads(features))
        samples = torch.stack([self.calibrator(self.heads(features)) for _ in range(self.mc_samples)])
        return mean_probability_logits(samples, self.layout)


def attach_second_stage_head(network: Network, cfg: TwoStageConfig, layout: LogitLayout) -> TwoStageNetwork:
    """Stage one's backbone and calibrator with a freshly initialised ``cfg.head``."""
    in_features = network.backbone.num_features
    heads = HEADS.get(cfg.head)(in_features, layout, latent_dim=cfg.latent_dim)
    device = next(network.parameters()).device
    return TwoStageNetwork(network.backbone, heads.to(device), network.calibrator, layout, cfg.mc_samples)


class WithAuxiliaryLoss(nn.Module):
    """The run's per-task loss plus ``weight * head.auxiliary_loss()`` (the KL term of V-TST).

    Added to every task's loss, so the mean over tasks that the training step takes adds it once.
    """

    def __init__(self, objective: nn.Module, heads: nn.Module, weight: float) -> None:
        super().__init__()
        self.objective, self.heads, self.weight = objective, heads, weight

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.objective(logits, labels) + self.weight * self.heads.auxiliary_loss()


def run_second_stage(
    accelerator: Accelerator,
    network: Network,
    objective: nn.Module,
    spec: TaskSpec,
    train: SplitData,
    val: SplitData,
    cfg: TwoStageConfig,
    train_cfg: TrainConfig,
    seed: int,
    run_dir: Path,
) -> nn.Module:
    """Train a new head on ``network``'s frozen backbone; return the prepared two-stage network.

    ``network`` is the unwrapped stage-one model with its best checkpoint loaded. It is kept as
    ``stage_one_model.safetensors``; the best two-stage network replaces ``best_model.safetensors``.
    """
    if accelerator.is_main_process:
        save_model(run_dir / rundir.STAGE_ONE_MODEL, network)
    model = attach_second_stage_head(network, cfg, spec.layout)
    counts = parameter_counts(model)
    accelerator.print(f"two-stage ({cfg.head} head, Z={cfg.latent_dim}): trainable parameters {counts}")
    if accelerator.is_main_process:
        atomic_write_json(run_dir / rundir.STAGE_TWO_PARAMS, {"counts": counts, "trained": ["heads"]})
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss = WithAuxiliaryLoss(objective, model.heads, cfg.kl_weight)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    transform = BatchTransform(spec, train=True, device=accelerator.device)

    best_nll, best_state, waited = math.inf, copy.deepcopy(model.heads.state_dict()), 0
    for epoch in range(1, cfg.epochs + 1):
        stats = train_one_epoch(accelerator, prepared, loss, optimizer, train, transform, train_cfg.batch_size,
                                seed + 1, epoch)  # seed + 1: other shuffles than stage one's
        val_nll = score(predict_split(accelerator, prepared, spec, val, train_cfg.eval_batch_size), [15])["mean"]["nll"]
        improved = val_nll < best_nll
        if improved:
            best_nll, best_state, waited = val_nll, copy.deepcopy(model.heads.state_dict()), 0
        else:
            waited += 1
        accelerator.print(f"stage two epoch {epoch:3d}/{cfg.epochs}  loss {stats['loss']:.4f}  "
                          f"val nll {val_nll:.4f}{'  *' if improved else ''}")
        if accelerator.is_main_process:
            append_jsonl(run_dir / rundir.STAGE_TWO_METRICS, {"epoch": epoch, "train_loss": stats["loss"],
                                                               "val_nll": val_nll, "best": improved})
        if waited >= cfg.patience:
            accelerator.print(f"stage two: no better validation NLL for {cfg.patience} epochs, stopping.")
            break
    model.heads.load_state_dict(best_state)
    if accelerator.is_main_process:
        save_model(run_dir / rundir.BEST_MODEL, model)
    accelerator.wait_for_everyone()
    return prepared
