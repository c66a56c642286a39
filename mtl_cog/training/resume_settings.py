"""Changed settings on ``--resume``: applied exactly, or refused; never written and then ignored.

``--resume RUN_DIR key=value`` loads the run's ``config.yaml`` with the overrides on top. What
can change mid-run is listed in ``APPLIED``; every other key is refused, because the saved state
(weights, optimiser moments, data order, best-so-far value) was made under the old value and
would silently disagree with it. Optimiser changes take effect from the first resumed step:
each group's rate becomes the new configured rate (when that rate changed), the step schedule
continues with the new ``lr_step_epochs`` / ``lr_gamma`` from the epoch reached, and
``resumes.jsonl`` in the run folder records when which keys changed (old -> new), so the run
folder says what ran: ``config.yaml`` holds the latest values, ``resumes.jsonl`` the history.

``plan_resume`` works this out once per resume (the saved config read once, the changes computed
once, the epochs already trained read from the saved state without loading it) and refuses
*before* anything is written: a refused ``--resume`` leaves ``config.yaml`` and every other file of
the run as they were, so the next plain ``--resume`` continues the run as if it had not been tried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mtl_cog.config import Config, load_config
from mtl_cog.errors import ConfigError
from mtl_cog.io import append_jsonl
from mtl_cog.runs import rundir
from mtl_cog.runs.training_state import read_progress

# Keys whose change on --resume is applied exactly (the optimiser/scheduler ones by
# ``apply_to_optimizer``, the others are read from the config as the run continues).
APPLIED = {
    "optim.follower_lr", "optim.leader_lr", "optim.lr_step_epochs", "optim.lr_gamma", "optim.weight_decay",
    "optim.allow_leader_lr_geq_follower",
    "train.epochs", "train.save_every_steps", "train.log_every_steps", "train.nonfinite", "train.eval_batch_size",
    "train.precision", "train.channels_last", "train.compile", "train.images_on_device", "train.dist_timeout_s",
    "tracking", "wandb_project", "wandb_group", "wandb_job_type",
    # where the run folder lies: a resumed run continues in RUN_DIR whatever output_dir says, so a campaign moved
    # to another folder (or machine) resumes its unfinished runs there instead of failing them
    "output_dir",
}


def flatten_settings(raw: dict, prefix: str = "") -> dict[str, object]:
    """A config dict as ``{dotted.key: value}`` (``model.timm_kwargs`` kept whole: one setting)."""
    out: dict[str, object] = {}
    for key, value in raw.items():
        if isinstance(value, dict) and key != "timm_kwargs":
            out.update(flatten_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_settings(old: Config, new: Config) -> dict[str, tuple[object, object]]:
    """{key: (old, new)} for every key whose value differs."""
    before, after = flatten_settings(old.to_dict()), flatten_settings(new.to_dict())
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)}


def check_changes(changes: dict[str, tuple[object, object]], next_epoch: int | None = None) -> None:
    """Refuse any change outside ``APPLIED``, and (given ``next_epoch``) an epoch count below what already ran."""
    refused = sorted(set(changes) - APPLIED)
    if refused:
        detail = ", ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in refused)
        raise ConfigError(
            f"--resume cannot change {detail}: the saved training state was made with the old value. "
            f"Start a new run for that (keys that can change on resume: {', '.join(sorted(APPLIED))})."
        )
    if next_epoch is not None and "train.epochs" in changes and changes["train.epochs"][1] < next_epoch - 1:
        raise ConfigError(f"--resume: train.epochs={changes['train.epochs'][1]} is below the {next_epoch - 1} "
                          "epochs this run already trained.")


def apply_to_optimizer(cfg: Config, changes: dict[str, tuple[object, object]], optimizer: torch.optim.Optimizer,
                       scheduler: torch.optim.lr_scheduler.StepLR) -> None:
    """Make the restored optimiser and schedule follow the new ``cfg.optim`` (see the module docstring)."""
    # the loss's own parameters (group "objective", e.g. FedLAS's gate) train at the follower rate
    configured = {"follower": cfg.optim.follower_lr, "leader": cfg.optim.leader_lr, "objective": cfg.optim.follower_lr}
    changed_rates = {"follower": "optim.follower_lr" in changes, "leader": "optim.leader_lr" in changes,
                     "objective": "optim.follower_lr" in changes}
    for group in optimizer.param_groups:
        name = group.get("name")
        if changed_rates.get(name):
            group["lr"] = group["initial_lr"] = configured[name]
        group["weight_decay"] = cfg.optim.weight_decay
    scheduler.step_size, scheduler.gamma = cfg.optim.lr_step_epochs, cfg.optim.lr_gamma
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]


def record_resume(path, epoch: int, step: int, changes: dict[str, tuple[object, object]]) -> None:
    append_jsonl(path, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "epoch": epoch, "step": step,
                        "changed": {k: {"old": old, "new": new} for k, (old, new) in changes.items()}})


@dataclass(frozen=True)
class ResumePlan:
    """What a ``--resume`` changes, checked: the saved config, the changed keys, the epoch it continues at."""

    saved: Config
    changes: dict[str, tuple[object, object]]
    next_epoch: int  # stage one's epoch to run (or continue) next, from the saved state (1: none yet)


def plan_resume(run_dir: Path, cfg: Config, saved: Config | None = None) -> ResumePlan:
    """Every check a resume with ``cfg`` can fail, done before anything is written (see the module docstring).

    ``saved`` is the run's ``config.yaml`` when the caller has read it already (``mtl-cog train --resume``).
    """
    saved = saved if saved is not None else load_config(run_dir / rundir.CONFIG)
    changes = changed_settings(saved, cfg)
    if "output_dir" in changes and Path(str(changes["output_dir"][1])).resolve() != Path(run_dir).resolve().parent:
        raise ConfigError(f"--resume {run_dir}: output_dir={changes['output_dir'][1]} is not the folder the run lies "
                          f"in; give output_dir={Path(run_dir).resolve().parent} (a run moved with its campaign) or "
                          "leave it out.")
    progress = read_progress(run_dir / rundir.STATE)
    next_epoch = progress.epoch if progress is not None else 1
    check_changes(changes, next_epoch)
    return ResumePlan(saved, changes, next_epoch)
