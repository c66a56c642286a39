"""Optimiser with explicit parameter ownership: the follower group and the leader group.

COG (paper Sec. 3) updates both groups from the same gradient of the same loss, in the same
step; the only difference is the learning rate: theta_f -= lr_f * grad_f, theta_c -= lr_c * grad_c
with lr_c < lr_f. Ownership is by module name (``method.leader``): every trainable parameter
lands in exactly one group, which ``tests/test_optim.py`` checks for every method. The groups are
the public API's (``mtl_cog.cog.parameter_groups``), so ``fit`` trains what a user's own loop on
``mtl_cog.cog`` trains.

A loss with parameters of its own (FedLAS's over/under-confidence gate) gets a third group,
``objective``, at the *follower* rate: the gate decides how much each training target is
smoothed, i.e. it shapes the follower's loss rather than calibrating the output; the FedLAS
authors train it with the network's optimiser and learning rate, and keeping it there makes
``fedlas`` and ``cog_fedlas`` differ only in COG's leader. Its own group keeps it visible
(learning rates, training state) and lets the step average its gradients over processes.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog import cog
from mtl_cog.config import OptimConfig


def split_parameters(network: nn.Module, leader_modules: list[str]) -> dict[str, list[nn.Parameter]]:
    """{"follower": [...], "leader": [...]}: every trainable parameter exactly once (``cog.split_parameters``)."""
    return cog.split_parameters(network, leader_modules)


OBJECTIVE_GROUP = "objective"


def build_optimizer(network: nn.Module, leader_modules: list[str], cfg: OptimConfig,
                    objective: nn.Module | None = None) -> torch.optim.Optimizer:
    """Adam on ``cog.parameter_groups``; an empty leader or objective group is left out (standard training).

    ``optim.allow_leader_lr_geq_follower`` (checked by the config) is passed on, so an ablation that asked for a
    fast leader is not warned about it again."""
    param_groups = cog.parameter_groups(network, cfg.follower_lr, leader=leader_modules, leader_lr=cfg.leader_lr,
                                        allow_fast_leader=cfg.allow_leader_lr_geq_follower)
    own = [p for p in objective.parameters() if p.requires_grad] if objective is not None else []
    if own:
        param_groups.append({"name": OBJECTIVE_GROUP, "params": own, "lr": cfg.follower_lr})
    return torch.optim.Adam(param_groups, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """Step schedule (lr * gamma every N epochs, or after each of ``cfg.lr_milestones``) for both groups.

    Stepped once per epoch by the training loop and deliberately *not* passed through
    ``accelerator.prepare``: Accelerate's wrapper steps it once per process, which would decay
    N times too fast on N processes (docs/explanation/architecture.md, "Pitfalls").
    """
    if cfg.lr_milestones:
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.lr_milestones), gamma=cfg.lr_gamma)
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.lr_step_epochs, gamma=cfg.lr_gamma)


def learning_rates(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    return {group["name"]: group["lr"] for group in optimizer.param_groups}
