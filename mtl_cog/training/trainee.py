"""What trains, built once: network -> objective -> optimiser (+ schedule) -> ``accelerator.prepare``.

``fit`` and every benchmark (``mtl_cog.benchmarks``) build their trainee here, so a benchmark
times exactly the network, loss and parameter groups that a run of the same config trains,
not a copy that happens to agree. The step it runs is the library's own
(``training.step.batch_loss`` + ``apply_update``, what ``train_one_epoch`` runs per batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch import nn

from mtl_cog.config import Config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.network import build_network, parameter_counts
from mtl_cog.objectives import build_objective, set_partial_labels
from mtl_cog.objectives.aggregators import build_aggregator
from mtl_cog.training import step as training_step
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss
from mtl_cog.training.optim import build_optimizer, build_scheduler
from mtl_cog.training.speed import apply_speed_options


@dataclass
class Trainee:
    """One config's prepared network (what the steps run), its unwrapped model (what is saved), objective,
    optimiser and epoch schedule (stepped by the loop, deliberately not prepared: ``training/optim.py``)."""

    accelerator: Accelerator
    network: nn.Module
    model: nn.Module
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    counts: dict  # parameter counts of the network as built (backbone / heads / calibrator / total)
    aggregation: Aggregation | None = None  # mtl.aggregator other than equal (docs/guides/mtl.md)

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``batch_loss`` (``aggregated_loss`` under an aggregator) then ``apply_update``: exactly one step of
        ``train_one_epoch``."""
        if self.aggregation is None:
            loss = to_backward = training_step.batch_loss(self.network, self.objective, images, labels)
        else:
            shared = [p for p in self.model.backbone.parameters() if p.requires_grad]
            out = aggregated_loss(self.accelerator, self.network, self.objective, self.aggregation, images, labels,
                                  shared)
            loss, to_backward = out.loss, out.backward
        training_step.apply_update(self.accelerator, self.optimizer, to_backward)
        return loss.detach()


def build_trainee(accelerator: Accelerator, cfg: Config, layout: LogitLayout, seed: int | None = None,
                  partial_labels: bool = False) -> Trainee:
    """Network, objective, optimiser and schedule of ``cfg``, prepared by ``accelerator``.

    ``seed`` (benchmarks: the same initial backbone for every method) seeds torch just before the
    network is built; ``fit`` passes none, having seeded every generator at the start of the run.
    The optimiser holds the loss's own parameters too (``training/optim.py``), so it is built after
    the objective, which is on the device first. ``partial_labels``: the data has missing labels
    (``MISSING_LABEL``), which the losses then look for in every batch.

    ``mtl.aggregator`` (None for ``equal``) is attached to the objective as ``aggregator``: what it
    learns (uncertainty weighting's log-variances) is, like a loss's own parameters, trained in the
    optimiser's ``objective`` group at the follower rate, averaged over processes and saved with the
    training state; an aggregator without parameters adds nothing to either. Stage two (TST/V-TST)
    trains only heads and keeps equal weights.
    """
    if seed is not None:
        torch.manual_seed(seed)
    network = apply_speed_options(build_network(cfg.model, cfg.method, layout), cfg.train)
    counts = parameter_counts(network)
    objective = build_objective(layout, cfg.method).to(accelerator.device)
    set_partial_labels(objective, partial_labels)
    aggregator = build_aggregator(cfg.mtl.aggregator, layout.num_tasks, cfg.seed)  # PCGrad's draws: the run's seed
    if aggregator is not None:
        objective.add_module("aggregator", aggregator.to(accelerator.device))
        where = f" (Gramian on the backbone's {cfg.mtl.aggregate_on})" if aggregator.needs_gramian else ""
        accelerator.print(f"mtl aggregator {cfg.mtl.aggregator}{where}: the backbone follows the aggregated "
                          "gradient, heads and leader the mean loss's")
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim, objective)
    scheduler = build_scheduler(optimizer, cfg.optim)  # stepped per epoch; not prepared (see optim.py)
    prepared, optimizer = accelerator.prepare(network, optimizer)
    aggregation = (Aggregation(aggregator, cfg.mtl.aggregate_on, conflict_every=cfg.mtl.conflict_every)
                   if aggregator is not None else None)
    return Trainee(accelerator, prepared, accelerator.unwrap_model(prepared), objective, optimizer, scheduler, counts,
                   aggregation)
