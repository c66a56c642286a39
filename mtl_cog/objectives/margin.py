"""A margin-aware objective, our reading of "calibration, curvature and margins" (no code is public).

The abstract: ECE and the Gauss-Newton curvature are both controlled by a margin-dependent
exponential tail functional E[exp(-gamma * margin)], and the proposed objective "explicitly targets
robust-margin tails and local smoothness". We define, per task, with phi the backbone's pooled
features (B, D) and m the signed logit margin of the true class:

    loss = CE + lambda * E[exp(-gamma * relu(m + rho * s))] + mu * E[s^2]

    m  = z_y - max_{j != y} z_j      (binary task on [0, z]: m = (2y - 1) z)
    s  = (|phi| / sqrt(D)) * (d m / d phi) . v,   v ~ N(0, I_D) drawn per sample and step

Each choice and why:
- *Robust margin* ``m + rho * s``: the first-order margin after moving the features by
  ``rho * |phi| * v / sqrt(D)`` (a random perturbation of relative size ~rho). Under that Gaussian
  perturbation E[exp(-gamma (m + rho s))] = exp(-gamma (m - gamma rho^2 |phi|^2 |grad m|^2 / (2D))),
  so the tail term penalises a small margin *and* a steep one: the margin a sample keeps under
  perturbation, not the margin alone. Features rather than pixels: the heads are where the
  logits' scale (and so over-confidence) is set, and a slope w.r.t. the features costs two
  backward passes through the heads only, not through the backbone (the step stays within 1.10x
  of cross-entropy; ``docs/explanation/neighbour_methods.md``).
- *Tail* ``exp(-gamma * relu(.))``: the exponential tail functional of the abstract, on correctly
  classified samples; a misclassified sample (negative robust margin) contributes 1 and no
  gradient, since exp(gamma |m|) would overflow and CE already pushes it.
- *Local smoothness* ``E[s^2]``: an unbiased estimate (E[(g.v)^2] = |g|^2) of the squared slope of
  the margin w.r.t. the features, relative to their norm: the factor |J|^2 of the Gauss-Newton
  curvature J^T H J that the heads control.
- The slope is scaled by |phi| / sqrt(D) (detached) so that lambda, rho and mu do not depend on
  the backbone's feature scale.

Defaults (lambda 0.1, gamma 1, rho 0.1, mu 0.01) are ours and conservative: every term is small
next to CE at initialisation. lambda = mu = 0 is cross-entropy exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss, known_labels, labelled_mean
from mtl_cog.objectives.cross_entropy import CrossEntropy


def signed_margins(logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout,
                   binary_columns: torch.Tensor | None = None,
                   binary_tasks: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) logits, (B, T) labels -> (B, T) margins of the true class (> 0 iff correct).

    All binary tasks in one op (a per-task loop over CelebA's 40 would cost more than the loss).
    ``binary_columns`` / ``binary_tasks``: the layout's index tensors already on the logits' device
    (the loss keeps them as buffers, so a training step copies nothing to the device).
    """
    margins = logits.new_zeros(len(logits), layout.num_tasks)
    if layout.binary_tasks:
        if binary_columns is None or binary_tasks is None:
            binary_columns = layout.binary_columns.to(logits.device)
            binary_tasks = torch.tensor(layout.binary_tasks, device=logits.device)
        z = logits[:, binary_columns]
        margins = margins.index_copy(1, binary_tasks, (2 * labels[:, binary_tasks].to(z.dtype) - 1) * z)
    for t in layout.multiclass_tasks:
        block = logits[:, layout.task_slice(t)]
        true = F.one_hot(labels[:, t], layout.widths[t]).bool()
        margin = block[true] - block.masked_fill(true, float("-inf")).amax(dim=1)
        margins = margins.index_copy(1, torch.tensor([t], device=logits.device), margin[:, None])
    return margins


def margin_slopes(margins: torch.Tensor, features: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """(B, T): the directional derivative of each margin w.r.t. its sample's features along ``direction``
    (B, D), by the double-vjp trick (one vjp of a dummy cotangent, one vjp of that), kept in the graph."""
    cotangent = torch.zeros_like(margins, requires_grad=True)
    (pullback,) = torch.autograd.grad(margins, features, grad_outputs=cotangent, create_graph=True)
    (slopes,) = torch.autograd.grad(pullback, cotangent, grad_outputs=direction, create_graph=True)
    return slopes


@OBJECTIVES.register("margin")
class MarginAwareLoss(PerTaskLoss):
    needs_features = True

    def __init__(self, layout: LogitLayout, method_cfg: MethodConfig) -> None:
        super().__init__(layout, method_cfg)
        self.cross_entropy = CrossEntropy(layout, method_cfg)
        self.tail_weight, self.gamma = method_cfg.margin_lambda, method_cfg.margin_gamma
        self.rho, self.smoothness_weight = method_cfg.margin_rho, method_cfg.margin_mu

    def margins_and_slopes(self, logits: torch.Tensor, labels: torch.Tensor,
                           features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) margins m and slopes s = (|phi| / sqrt(D)) * (d m / d phi) . v for a fresh v ~ N(0, I)."""
        margins = signed_margins(logits, labels, self.layout, self.binary_columns, self.binary_tasks)
        flat = features.flatten(1)
        direction = torch.randn_like(flat).view_as(features)
        scale = flat.detach().norm(dim=1, keepdim=True) / math.sqrt(flat.shape[1])
        return margins, scale * margin_slopes(margins, features, direction)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        losses = self.cross_entropy(logits, labels)
        if self.tail_weight == 0 and self.smoothness_weight == 0:
            return losses
        if self.has_missing(labels):  # partly labelled: margins exist only where the label is known
            filled, known = known_labels(labels)
            margins, slopes = self.margins_and_slopes(logits, filled, features)
            tail = labelled_mean(torch.exp(-self.gamma * F.relu(margins + self.rho * slopes)), known)
            return losses + self.tail_weight * tail + self.smoothness_weight * labelled_mean(slopes.pow(2), known)
        margins, slopes = self.margins_and_slopes(logits, labels, features)
        tail = torch.exp(-self.gamma * F.relu(margins + self.rho * slopes)).mean(0)
        return losses + self.tail_weight * tail + self.smoothness_weight * slopes.pow(2).mean(0)
