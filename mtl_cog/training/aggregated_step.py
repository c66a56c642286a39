"""One training step with a multi-task aggregator: one forward, one backward, the backbone's gradient aggregated.

Which gradient each parameter group gets (docs/mtl.md):

- the shared backbone: sum_t w_t grad L_t, the aggregator's weights w (T,) applied to the per-task
  gradients;
- each task's head, and the calibrator: the gradient of the mean loss (1/T) sum_t L_t, i.e. its
  own task's gradient (a head of task t only reaches L_t), exactly what equal weights gives;
- the COG leader (the heads or the calibrator) is therefore updated by COG's rule unchanged:
  the same loss, from the same minibatch and the same backward pass, at its smaller rate.
  Weighting the leader's own gradient by w_t would change its effective rate task by task, which
  is the one thing COG fixes (leader_lr < follower_lr), so no aggregator touches it.

How, in one forward and one backward pass: the network returns the backbone's features Z (B, D)
and the logits; the per-task losses L (T,) are computed once. The per-task gradients w.r.t. Z,
J = dL/dZ (T, B, D), are one batched vector-Jacobian product through the heads only (cheap),
and their Gramian J J^T is Sener & Koltun's MGDA-UB bound (``mtl.aggregate_on=features``); with
``parameters`` the Gramian is of the per-task gradients w.r.t. the backbone's parameters (one
batched backward through the backbone: exact, much dearer). The aggregator turns the Gramian into
w. Then the ordinary backward of the mean loss runs, and a hook on Z replaces the gradient that
reaches the backbone by sum_t w_t dL_t/dZ: the heads and the calibrator receive the mean loss's
gradient, the backbone sum_t w_t dL_t/dtheta, in the same pass.

Several processes (DDP): each process has a shard of the batch. The Gramian of the whole batch's
per-task gradients is summed from the shards' (features: sum_r G_r / R^2, the Jacobian of the
global mean w.r.t. the concatenated features being the shards' blocks / R; parameters: the
per-task parameter gradients are averaged over processes first), so every process computes the
same w. Each process then back-propagates sum_t w_t L_t^(r), and DDP's averaging gives
sum_t w_t mean_r grad L_t^(r) = sum_t w_t grad L_t: because the combination is linear and w is
shared, weighting before the gradient synchronisation equals aggregating after it, without
synchronising T gradients (only a T x T Gramian per step).

Mixed precision: Z and the losses leave the autocast region in float32 (Accelerate converts the
outputs), the Gramian is solved in float64; with fp16's loss scaling the replaced gradient is
multiplied by the same scale as the rest of the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.objectives.aggregators import TaskAggregator


@dataclass
class Aggregation:
    """The aggregator of a run and where its Gramian is taken (``mtl.aggregate_on``)."""

    aggregator: TaskAggregator
    on: str = "features"  # features | parameters
    batched: bool = True  # per-task gradients with one vmapped backward; False after vmap failed once


@dataclass
class AggregatedLoss:
    loss: torch.Tensor  # the mean of the per-task losses: what is reported (and what equal weights trains)
    backward: torch.Tensor  # what to back-propagate: the mean loss (+ the aggregator's own penalty)
    weights: torch.Tensor  # (T,) float64: the backbone's task weights of this step


def per_task_gradients(aggregation: Aggregation, losses: torch.Tensor,
                       inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """d L_t / d input for every task t and input: a (T, *input.shape) tensor per input, graph kept.

    One vmapped vector-Jacobian product (``is_grads_batched``); an op without a batching rule makes
    it fall back, once and for the rest of the run, to one product per task. Features the losses do
    not depend on are an error (the hook on them would never fire); an unused backbone parameter
    (a layer a timm model skips) simply has zero gradients.
    """
    eye = torch.eye(len(losses), dtype=losses.dtype, device=losses.device)
    unused = aggregation.on == "parameters"
    if aggregation.batched:
        try:
            return list(torch.autograd.grad(losses, inputs, grad_outputs=eye, is_grads_batched=True,
                                            retain_graph=True, allow_unused=unused, materialize_grads=unused))
        except RuntimeError:
            aggregation.batched = False
    rows = [torch.autograd.grad(losses, inputs, grad_outputs=e, retain_graph=True, allow_unused=unused,
                                materialize_grads=unused) for e in eye]
    return [torch.stack([row[i] for row in rows]) for i in range(len(inputs))]


def gramian(accelerator: Accelerator, jacobians: list[torch.Tensor], on: str) -> torch.Tensor:
    """(T, T) Gramian of the whole batch's per-task gradients, identical on every process (see module docstring)."""
    world = accelerator.num_processes
    if on == "parameters" and world > 1:
        jacobians = [accelerator.reduce(j.contiguous(), reduction="mean") for j in jacobians]
    flat = [j.reshape(len(j), -1).float() for j in jacobians]
    total = sum(f @ f.T for f in flat)
    if on == "features" and world > 1:
        total = accelerator.reduce(total, reduction="sum") / world**2
    return total


def aggregated_loss(accelerator: Accelerator, network: torch.nn.Module, objective: torch.nn.Module,
                    aggregation: Aggregation, images: torch.Tensor, labels: torch.Tensor,
                    shared: list[torch.nn.Parameter]) -> AggregatedLoss:
    """One forward pass and the task weights; the hook on the features is in place for ``apply_update``.

    ``shared``: the backbone's trainable parameters (used for ``aggregate_on=parameters``).
    """
    features, logits = network(images, with_features=True)
    if getattr(objective, "needs_features", False):
        losses = objective(logits, labels, features=features)
    else:
        losses = objective(logits, labels)
    aggregator = aggregation.aggregator
    # a task with no labelled sample in the whole batch (every process) has no gradient: weight 0
    present = (labels != MISSING_LABEL).any(0)
    if accelerator.num_processes > 1:
        present = accelerator.reduce(present.to(torch.int32), reduction="sum") > 0
    feature_jacobian = None
    if aggregator.needs_gramian:
        inputs = [features] if aggregation.on == "features" else shared
        jacobians = per_task_gradients(aggregation, losses, inputs)
        if aggregation.on == "features":
            feature_jacobian = jacobians[0]
        weights = aggregator.weights(gramian(accelerator, jacobians, aggregation.on), losses.detach(), present)
    else:
        weights = aggregator.weights(None, losses.detach(), present)
    w = weights.to(losses.dtype)
    if feature_jacobian is not None:
        combined = torch.einsum("t,t...->...", w, feature_jacobian)
    else:
        (combined,) = torch.autograd.grad(losses, features, grad_outputs=w, retain_graph=True, materialize_grads=True)
    combined = combined.detach()
    scaler = accelerator.scaler

    def to_backbone(grad: torch.Tensor) -> torch.Tensor:
        scale = scaler.get_scale() if scaler is not None else 1.0  # fp16: the backward pass's loss scale
        return (combined * scale).to(grad.dtype)

    features.register_hook(to_backbone)
    loss = losses.mean()
    return AggregatedLoss(loss, loss + aggregator.penalty(losses, present), weights.detach())
