"""FedLAS, feature-modulated bidirectional label smoothing (Bahavan, Seneviratne & Halgamuge), and FedLAS+.

Written from the authors' released code (``calibrate/losses/fedlas.py`` of their repository), not
copied; formulas and defaults are theirs:

- **NCI** (feature-norm confidence indicator): the L1 norm of each sample's pooled backbone
  features, standardised by running statistics, ``s = (|phi|_1 - mean) / (std + 1e-3)``. In
  training the statistics are first updated, ``mean <- momentum * batch_mean + (1 - momentum) *
  mean`` (so ``momentum`` weighs the *new* batch; 0.95 on CIFAR-10), starting at mean 20, std
  100. The features are detached: the indicator does not train the backbone.
- **Gate** (BCG, bidirectional calibration gating): a small MLP on the *detached* logits,
  Linear(K, K//2) -> LeakyReLU(0.01) -> Linear(K//2, 2) -> softmax -> p_1 - p_0 -> sign, with a
  straight-through gradient (the sign's gradient is taken as 1). It says whether a sample is
  over- (+1) or under-confident (-1). Its only gradient is the loss itself through the sign.
- Per-sample smoothing ``r = 2 * alpha * sigmoid(beta * gate * s)`` in (0, 2 alpha); with gate 0
  (a tie) r = alpha, plain label smoothing.
- FedLAS: ``(1 - r) * CE + r * mean_j(-log p_j)`` (label smoothing with a per-sample amount).
  FedLAS+ (``fedlas_mbls``): ``(1 - r) * CE + r * mean_j max(0, d_j - m)`` (MbLS's margin term,
  weighted by r instead of MbLS's lambda; authors' CIFAR-10 defaults alpha 0.1, beta 0.5, m 6).

Our additions, since the authors train one single-label task:
- One gate per task (a task's over/under-confidence is its own), one NCI for the network (the
  features are shared). Binary tasks are the two-class problem on [0, z]: the gate sees [0, z],
  CE is the logistic loss, mean_j(-log p_j) = (softplus(z) + softplus(-z)) / 2 and the margin term
  is max(0, |z| - m) / 2 (as in ``mtl_cog.objectives.mbls``). The binary tasks' gates run as one
  batched op.
- A batch of one sample has no standard deviation: the running statistics are then left as
  they are (the authors' code would turn them into NaN).
- With several processes each updates the running statistics from its own share of the batch;
  the gate's gradients are averaged like the network's (``training.step.apply_update``).

The gate's parameters belong to the loss; ``mtl_cog.training.optim`` trains them in their own
group at the follower rate (as the authors, with the network's optimiser) and the training state
saves them with the running statistics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.heads import uniform_parameter
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss
from mtl_cog.objectives.mbls import binary_margin_penalty, multiclass_margin_penalty


def sign_straight_through(x: torch.Tensor) -> torch.Tensor:
    """sign(x) forward (0 at 0), identity gradient backward."""
    return x + (torch.sign(x) - x).detach()


class BinaryGates(nn.Module):
    """The gate of every binary task at once: [0, z_t] -> Linear(2, 1) -> LeakyReLU -> Linear(1, 2)."""

    def __init__(self, tasks: int) -> None:
        super().__init__()
        self.w1, self.b1 = uniform_parameter((tasks, 2, 1), 2), uniform_parameter((tasks, 1), 2)
        self.w2, self.b2 = uniform_parameter((tasks, 1, 2), 1), uniform_parameter((tasks, 2), 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(B, Tb) logits -> (B, Tb, 2) gate scores."""
        pair = torch.stack([torch.zeros_like(z), z], dim=-1)
        hidden = F.leaky_relu(torch.einsum("btk,tkh->bth", pair, self.w1) + self.b1, negative_slope=0.01)
        return torch.einsum("bth,tho->bto", hidden, self.w2) + self.b2


def multiclass_gate(num_classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(num_classes, num_classes // 2), nn.LeakyReLU(0.01), nn.Linear(num_classes // 2, 2))


def gate_sign(scores: torch.Tensor) -> torch.Tensor:
    """(..., 2) gate scores -> (...) sign(p_1 - p_0), straight-through."""
    p = scores.softmax(dim=-1)
    return sign_straight_through(p[..., 1] - p[..., 0])


class FeatureNormIndicator(nn.Module):
    """NCI: standardised L1 feature norm with running mean/std (the authors' initial values 20 and 100)."""

    def __init__(self, momentum: float) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.tensor(20.0))
        self.register_buffer("running_std", torch.tensor(100.0))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        norms = features.detach().float().abs().flatten(1).sum(1)
        if self.training and len(norms) > 1:
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * norms.mean())
                self.running_std.mul_(1 - self.momentum).add_(self.momentum * norms.std())
        return (norms - self.running_mean) / (self.running_std + 1e-3)


@OBJECTIVES.register("fedlas")
class FeatureModulatedLabelSmoothing(PerTaskLoss):
    """FedLAS on label smoothing: (1 - r) * CE + r * mean_j(-log p_j), r per sample and task."""

    needs_features = True

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.alpha, self.beta = method_cfg.fedlas_alpha, method_cfg.fedlas_beta
        self.margin = method_cfg.mbls_margin
        self.indicator = FeatureNormIndicator(method_cfg.fedlas_momentum)
        self.binary_gates = BinaryGates(len(layout.binary_tasks)) if layout.binary_tasks else None
        self.multiclass_gates = nn.ModuleDict({str(t): multiclass_gate(layout.num_classes[t])
                                               for t in layout.multiclass_tasks})

    def smoothing(self, gate: torch.Tensor, indicator: torch.Tensor) -> torch.Tensor:
        """r = 2 alpha sigmoid(beta * gate * s): gate (B, ...) and indicator (B,) -> (B, ...)."""
        s = indicator.view(-1, *([1] * (gate.dim() - 1)))
        return 2 * self.alpha * torch.sigmoid(self.beta * gate * s)

    def binary_regulariser(self, z: torch.Tensor) -> torch.Tensor:
        """(B, Tb) -> (B, Tb): mean over the two classes of -log p_j."""
        return (F.softplus(z) + F.softplus(-z)) / 2

    def multiclass_regulariser(self, z: torch.Tensor) -> torch.Tensor:
        """(B, K) -> (B,): mean_j -log p_j."""
        return -F.log_softmax(z, dim=1).mean(dim=1)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        indicator = self.indicator(features)

        def binary(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            r = self.smoothing(gate_sign(self.binary_gates(z.detach())), indicator)
            ce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
            # (1 - r) CE + r reg, written so that r = 0 is cross-entropy to the last bit
            return ce + r * (self.binary_regulariser(z) - ce)

        def multiclass(z: torch.Tensor, y: torch.Tensor, task: int, rows: torch.Tensor | None) -> torch.Tensor:
            task_indicator = indicator if rows is None else indicator[rows]  # the task's labelled samples
            r = self.smoothing(gate_sign(self.multiclass_gates[str(task)](z.detach())), task_indicator)
            ce = F.cross_entropy(z, y, reduction="none")
            return F.cross_entropy(z, y) + (r * (self.multiclass_regulariser(z) - ce)).mean()

        return self.per_task(logits, labels, binary, multiclass)


@OBJECTIVES.register("fedlas_mbls")
class FeatureModulatedMarginSmoothing(FeatureModulatedLabelSmoothing):
    """FedLAS+ (FedLAS on MbLS): (1 - r) * CE + r * mean_j max(0, d_j - m)."""

    def binary_regulariser(self, z: torch.Tensor) -> torch.Tensor:
        return binary_margin_penalty(z, self.margin)

    def multiclass_regulariser(self, z: torch.Tensor) -> torch.Tensor:
        return multiclass_margin_penalty(z, self.margin)
