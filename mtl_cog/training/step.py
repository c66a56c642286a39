"""One training step and one training epoch, under Accelerate (any number of processes).

``batch_loss`` (forward + loss) and ``apply_update`` (backward + optimiser step) are the step;
``train_one_epoch`` runs them over a split with resumable progress and the non-finite-loss
policy. The benchmarks time exactly these functions, so what they measure is what trains.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from mtl_cog.data.batches import BatchTransform, train_batch_indices
from mtl_cog.data.task_api import SplitData
from mtl_cog.errors import NonFiniteLossError
from mtl_cog.runs.training_state import EpochProgress
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss
from mtl_cog.training.optim import OBJECTIVE_GROUP


def batch_loss(network: torch.nn.Module, objective: torch.nn.Module, images: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """The scalar training loss of one batch: the mean of the per-task losses (equal task weights).

    A loss that declares ``needs_features`` also receives the backbone's pooled features.
    """
    if getattr(objective, "needs_features", False):
        features, logits = network(images, with_features=True)
        return objective(logits, labels, features=features).mean()
    return objective(network(images), labels).mean()


def apply_update(accelerator: Accelerator, optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One backward pass and one optimiser step for both parameter groups (leader and follower).

    Leader and follower are two parameter groups of the same optimiser, so COG costs exactly
    what standard training costs (paper Sec. 3). Parameters owned by the loss (group
    ``objective``, e.g. FedLAS's gate) are not inside the DDP-wrapped network, so their gradients
    are averaged over processes here, as DDP does for the network's.
    """
    optimizer.zero_grad(set_to_none=True)
    accelerator.backward(loss)
    if accelerator.num_processes > 1:
        for group in optimizer.param_groups:
            if group.get("name") == OBJECTIVE_GROUP:
                for param in group["params"]:
                    if param.grad is not None:
                        param.grad = accelerator.reduce(param.grad, reduction="mean")
    optimizer.step()


NO_BAD_STEP = 2**62  # "no non-finite loss seen yet" (a step index no epoch reaches)


def train_one_epoch(
    accelerator: Accelerator,
    network: torch.nn.Module,
    objective: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    split: SplitData,
    transform: BatchTransform,
    batch_size: int,
    seed: int,
    epoch: int,
    *,
    start: EpochProgress | None = None,
    nonfinite: str = "stop",
    check_every: int = 50,
    save_every: int = 0,
    on_save: Callable[[EpochProgress], None] | None = None,
    aggregation: Aggregation | None = None,
) -> dict[str, float]:
    """One pass over ``split``: ``batch_loss`` then ``apply_update`` per step.

    With an ``aggregation`` (``mtl.aggregator`` other than ``equal``) the step is
    ``aggregated_step.aggregated_loss`` instead of ``batch_loss`` (the backbone follows the
    aggregated gradient, the heads and the leader the mean loss's), and the epoch also returns
    ``task_weights``: the backbone's mean task weights over the epoch's steps (their sums travel with a
    mid-epoch save, so a continued epoch reports what the uninterrupted one would), and, where steps were
    checked (``Aggregation.checks_conflict``), ``conflict_rate``: the share of checked steps in which some
    task's loss rises to first order under the backbone's update.

    Resumable: ``start`` continues an epoch after its first ``start.step`` batches, and every
    ``save_every`` steps ``on_save(progress)`` is called (on every process) to save the state.
    The augmentation generator is re-seeded from (seed, epoch, step, rank) at every step, so a
    continued epoch draws exactly the crops and flips the uninterrupted one would.

    Non-finite loss: with ``nonfinite="skip"`` such a batch gets no update (all processes agree,
    one host sync per step). With ``"stop"`` the first bad step is recorded on the device and
    looked at every ``check_every`` steps, before any save and at the end, so no host sync is
    added per step and nothing trained on NaN is ever saved.
    """
    network.train()
    rank, world = accelerator.process_index, accelerator.num_processes
    device = accelerator.device
    done = start or EpochProgress()
    generator = torch.Generator()
    batches = list(train_batch_indices(len(split), batch_size, rank, world, seed, epoch))
    # Each process continues its own partial sum (the same float32 additions as without a break);
    # resumed with another process count, each starts from the mean: mean(c + x_r) = c + mean(x_r).
    sums = done.loss_sums
    start_sum = sums[rank] if len(sums) == world else sum(sums) / max(len(sums), 1)
    total = torch.tensor(start_sum, device=device)
    trained, skipped = done.trained, done.skipped
    bad_step = torch.tensor(NO_BAD_STEP, device=device)
    weight_sum, carried = None, False
    if aggregation is not None:
        tasks = aggregation.aggregator.num_tasks
        carried = len(done.weight_sums) == tasks  # a state saved before the sums were: count from the resume
        weight_sum = torch.tensor(done.weight_sums if carried else [0.0] * tasks, dtype=torch.float64, device=device)
        weight_steps_before = 0 if carried else done.trained
        checked, conflicts = done.conflicts if len(done.conflicts) == 2 else (0, 0)
        shared = [p for p in accelerator.unwrap_model(network).backbone.parameters() if p.requires_grad]

    def check_finite() -> None:
        first_bad = -int(accelerator.reduce(-bad_step, reduction="max").item())  # min over processes
        if first_bad != NO_BAD_STEP:
            raise NonFiniteLossError(
                f"non-finite training loss at epoch {epoch}, step {first_bad + 1} of {len(batches)}. Training "
                "stopped; the last saved state is kept (continue with --resume RUN_DIR, e.g. with a smaller "
                "optim.follower_lr, or set train.nonfinite=skip to skip such batches)."
            )

    progress_bar = tqdm(range(done.step, len(batches)), desc=f"epoch {epoch}", leave=False,
                        disable=not (accelerator.is_local_main_process and sys.stderr.isatty()))
    for step in progress_bar:
        idx = batches[step]
        generator.manual_seed(seed * 7919 + epoch * 104_729 + step * 1_000_003 + rank)
        images = transform(split.images[idx].to(device, non_blocking=True), generator)
        labels = split.labels[idx].to(device, non_blocking=True)
        if aggregation is None:
            loss = to_backward = batch_loss(network, objective, images, labels)
            finite = torch.isfinite(loss)
        else:
            step_loss = aggregated_loss(accelerator, network, objective, aggregation, images, labels, shared,
                                        check_conflict=aggregation.checks_conflict(step))
            loss, to_backward = step_loss.loss, step_loss.backward
            finite = torch.isfinite(to_backward) & torch.isfinite(step_loss.weights).all()
        if nonfinite == "skip":
            if accelerator.reduce(finite.float(), reduction="sum").item() < world:  # any process bad: all skip
                skipped += 1
                continue
        else:
            bad_step = torch.where(finite | (bad_step != NO_BAD_STEP), bad_step, step)
        apply_update(accelerator, optimizer, to_backward)
        total += loss.detach()
        if weight_sum is not None:
            weight_sum += step_loss.weights
            if step_loss.conflict is not None:  # the same on every process (global Gramian or reduced JVP)
                checked, conflicts = checked + 1, conflicts + int(step_loss.conflict)
        trained += 1
        if nonfinite == "stop" and (step + 1) % check_every == 0:
            check_finite()
        if on_save is not None and save_every and (step + 1) % save_every == 0 and step + 1 < len(batches):
            if nonfinite == "stop":
                check_finite()
            weights_so_far = weight_sum.tolist() if weight_sum is not None else []
            on_save(EpochProgress(step + 1, accelerator.gather(total.view(1)).tolist(), trained, skipped,
                                  weights_so_far, [checked, conflicts] if weight_sum is not None else []))
    if nonfinite == "stop":
        check_finite()
    mean_loss = accelerator.reduce(total, reduction="mean").item() / max(trained, 1)
    stats = {"loss": mean_loss, "steps": trained, "skipped": skipped}
    if weight_sum is not None:
        stats["task_weights"] = (weight_sum / max(trained - weight_steps_before, 1)).tolist()
        if checked:
            stats["conflict_rate"] = conflicts / checked
    return stats
