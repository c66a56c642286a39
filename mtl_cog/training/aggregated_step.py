"""One training step with a multi-task aggregator: one forward, one backward, the backbone's gradient aggregated.

Which gradient each parameter group gets (docs/guides/mtl.md):

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
``parameters`` the Gramian is of the per-task gradients w.r.t. the backbone's parameters (T
backward passes through the backbone, batched on an accelerator: exact, much dearer). The
aggregator turns the Gramian into w. Then the ordinary backward of the mean loss runs, and a hook
on Z replaces the gradient that reaches the backbone by sum_t w_t dL_t/dZ: the heads and the
calibrator receive the mean loss's gradient, the backbone sum_t w_t dL_t/dtheta, in the same pass.

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

What the two places promise. UPGrad, MGDA and IMTL-G are defined by a property of the update
d = sum_t w_t g_t with respect to the gradients g_t it is built from (UPGrad, MGDA: <g_t, d> >= 0
for every t, no task's loss rises to first order). With ``aggregate_on=parameters`` the g_t are
the per-task gradients of the backbone's parameters, the property holds for the backbone's update,
and the check below is free ((G w)_t from the Gramian at hand). With ``features`` the weights come
from the Gramian of dL_t/dZ at the backbone's output: a representation-level heuristic. The
backbone's parameter Gramian is J_Z K J_Z^T, K the backbone's kernel between the batch's samples,
so weights that keep <j_t, c> >= 0 at the features need not keep <g_t, d> >= 0 at the parameters.
Sener & Koltun's MGDA-UB bound justifies the shortcut for MGDA only (the min-norm point of the
feature gradients bounds that of the parameter gradients); for the other weightings it is a
cheap substitute whose conflicts are measured, not ruled out.

``conflict`` (logged per epoch as ``mtl/conflict_rate``): whether some task's loss rises to first
order under the backbone's aggregated gradient d (before the optimiser's per-coordinate scaling,
which acts alike on every method), i.e. <g_t, d> < -``CONFLICT_TOL`` |d|^2 for some present task t.
Parameters: from the exact Gramian, every step. Features: <g_t, d> is one forward-mode product
(the losses' JVP along d, after d is formed by one backward through the backbone), about 1.7
steps of work, so it runs on the steps the epoch asks for (``mtl.conflict_every``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.objectives.aggregators import TaskAggregator

CONFLICT_TOL = 1e-6  # a rise is <g_t, d> < -1e-6 |d|^2: below the solvers' float64 precision it is rounding


@dataclass
class Aggregation:
    """The aggregator of a run and where its Gramian is taken (``mtl.aggregate_on``)."""

    aggregator: TaskAggregator
    on: str = "features"  # features | parameters
    batched: bool = True  # per-task gradients with one vmapped backward; False after vmap failed once
    conflict_every: int = 10  # features: check the first-order conflict every this many steps (0 = never)

    def checks_conflict(self, step: int) -> bool:
        """Whether step ``step`` of an epoch is checked for a first-order conflict (every step on parameters)."""
        if not self.aggregator.needs_gramian:
            return False
        return self.on == "parameters" or (self.conflict_every > 0 and step % self.conflict_every == 0)


@dataclass
class AggregatedLoss:
    loss: torch.Tensor  # the mean of the per-task losses: what is reported (and what equal weights trains)
    backward: torch.Tensor  # what to back-propagate: the mean loss (+ the aggregator's own penalty)
    weights: torch.Tensor  # (T,) float64: the backbone's task weights of this step
    conflict: torch.Tensor | None = None  # bool: some task's loss rises to first order; None: not checked


def rises(inner: torch.Tensor, update_sq: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Whether some present task's loss rises to first order: <g_t, d> < -CONFLICT_TOL |d|^2 (float64 inputs)."""
    return ((inner < -CONFLICT_TOL * update_sq) & present.to(inner.device)).any()


def conflict_from_gramian(gramian: torch.Tensor, weights: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``rises`` of d = sum_t w_t g_t from the Gramian G of the g_t: <g_t, d> = (G w)_t, |d|^2 = w^T G w."""
    g = gramian.to(torch.float64)
    w = torch.nan_to_num(weights.to(g.device, torch.float64))
    inner = g @ w
    return rises(inner, w @ inner, present)


def conflict_by_jvp(accelerator: Accelerator, network: torch.nn.Module, objective: torch.nn.Module,
                    images: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, combined: torch.Tensor,
                    shared: list[torch.nn.Parameter], present: torch.Tensor) -> torch.Tensor:
    """``rises`` at the backbone's parameters when the weights came from the features.

    d = (dZ/dtheta)^T c, one backward through the backbone (c: the cotangent the hook puts on Z);
    <g_t, d> for every t at once is the JVP of the losses along d (``torch.func.jvp``). BatchNorm
    layers run on the batch's statistics as in the step, without updating their running statistics
    (``track_running_stats`` off for the product: a transform may not mutate them, and the step's own
    forward has updated them already). Several processes: d is averaged over them first (the global
    update), then the shards' <g_t^r, d>.
    """
    grads = torch.autograd.grad(features, shared, grad_outputs=combined, retain_graph=True, allow_unused=True,
                                materialize_grads=True)
    if accelerator.num_processes > 1:
        grads = [accelerator.reduce(g.contiguous(), reduction="mean") for g in grads]
    model = accelerator.unwrap_model(network)
    names = {id(p): name for name, p in model.named_parameters()}
    primals = {names[id(p)]: p.detach() for p in shared}
    tangents = {names[id(p)]: g.detach() for p, g in zip(shared, grads)}

    def losses_of(params: dict[str, torch.Tensor]) -> torch.Tensor:
        feats, logits = torch.func.functional_call(model, params, (images,), {"with_features": True})
        if getattr(objective, "needs_features", False):
            return objective(logits, labels, features=feats)
        return objective(logits, labels)

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.training and m.track_running_stats]
    try:
        for m in norms:
            m.track_running_stats = False
        with torch.no_grad():
            _, inner = torch.func.jvp(losses_of, (primals,), (tangents,))
    finally:
        for m in norms:
            m.track_running_stats = True
    inner = inner.to(torch.float64)
    if accelerator.num_processes > 1:
        inner = accelerator.reduce(inner, reduction="mean")
    return rises(inner, sum((g.to(torch.float64) ** 2).sum() for g in grads), present)


def per_task_gradients(aggregation: Aggregation, losses: torch.Tensor,
                       inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """d L_t / d input for every task t and input: a (T, *input.shape) tensor per input, graph kept.

    One vmapped vector-Jacobian product (``is_grads_batched``); an op without a batching rule makes
    it fall back, once and for the rest of the run, to one product per task. Through the backbone
    (``parameters``) on a CPU, one backward per task is taken from the start: measured on the step
    benchmark's backbone (cog_cnn_small, 32 px, batch 128, 40 tasks, one thread), 40 backward passes
    cost 21x an equal-weights step and one vmapped backward of 40 cotangents 42x (vmap's convolution
    and BatchNorm rules run T-times larger tensors no faster than T calls). On an accelerator the
    vmapped product stays (one launch of T-wide kernels; not measured on a GPU here). Features the
    losses do not depend on are an error (the hook on them would never fire); an unused backbone
    parameter (a layer a timm model skips) simply has zero gradients.
    """
    eye = torch.eye(len(losses), dtype=losses.dtype, device=losses.device)
    unused = aggregation.on == "parameters"
    if aggregation.batched and not (unused and losses.device.type == "cpu"):
        try:
            return list(torch.autograd.grad(losses, inputs, grad_outputs=eye, is_grads_batched=True,
                                            retain_graph=True, allow_unused=unused, materialize_grads=unused))
        except RuntimeError:
            aggregation.batched = False
    out: list[torch.Tensor] = []  # filled row by row: a stack of T rows would hold the (T, P) Jacobian twice
    for t, e in enumerate(eye):
        row = torch.autograd.grad(losses, inputs, grad_outputs=e, retain_graph=True, allow_unused=unused,
                                  materialize_grads=unused)
        if not out:
            out = [g.new_empty((len(eye), *g.shape)) for g in row]
        for full, g in zip(out, row):
            full[t] = g
    return out


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
                    shared: list[torch.nn.Parameter], check_conflict: bool = False) -> AggregatedLoss:
    """One forward pass and the task weights; the hook on the features is in place for ``apply_update``.

    ``shared``: the backbone's trainable parameters (the Gramian's with ``aggregate_on=parameters``).
    ``check_conflict``: also say whether some task's loss rises to first order (``AggregatedLoss.conflict``).
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
    conflict = None
    if aggregator.needs_gramian:
        inputs = [features] if aggregation.on == "features" else shared
        jacobians = per_task_gradients(aggregation, losses, inputs)
        if aggregation.on == "features":
            feature_jacobian = jacobians[0]
        matrix = gramian(accelerator, jacobians, aggregation.on)
        weights = aggregator.weights(matrix, losses.detach(), present)
        if check_conflict and aggregation.on == "parameters":
            conflict = conflict_from_gramian(matrix, weights, present)
    else:
        weights = aggregator.weights(None, losses.detach(), present)
    w = weights.to(losses.dtype)
    if feature_jacobian is not None:
        combined = torch.einsum("t,t...->...", w, feature_jacobian)
    else:
        (combined,) = torch.autograd.grad(losses, features, grad_outputs=w, retain_graph=True, materialize_grads=True)
    combined = combined.detach()
    if check_conflict and conflict is None and aggregator.needs_gramian:
        conflict = conflict_by_jvp(accelerator, network, objective, images, labels, features, combined, shared,
                                   present)
    scaler = accelerator.scaler

    def to_backbone(grad: torch.Tensor) -> torch.Tensor:
        scale = scaler.get_scale() if scaler is not None else 1.0  # fp16: the backward pass's loss scale
        return (combined * scale).to(grad.dtype)

    features.register_hook(to_backbone)
    loss = losses.mean()
    return AggregatedLoss(loss, loss + aggregator.penalty(losses, present), weights.detach(), conflict)
