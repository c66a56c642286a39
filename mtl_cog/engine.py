"""One training epoch and one prediction pass, under Accelerate (any number of processes)."""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from mtl_cog.data import BatchTransform, eval_batch_indices, train_batch_indices
from mtl_cog.errors import UserError
from mtl_cog.task_api import SplitData


class NonFiniteLossError(UserError, RuntimeError):
    """The loss became NaN or infinite; the message names epoch and step."""


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
) -> dict[str, float]:
    """One pass over ``split``: one forward and one backward per step, one optimiser step.

    Leader and follower are two parameter groups of the same optimiser, so COG costs exactly
    what standard training costs (paper Sec. 3).
    """
    network.train()
    rank, world = accelerator.process_index, accelerator.num_processes
    generator = torch.Generator().manual_seed(seed * 7919 + epoch * 104_729 + rank)
    batches = list(train_batch_indices(len(split), batch_size, rank, world, seed, epoch))
    total, count = torch.zeros((), device=accelerator.device), 0
    for step, idx in enumerate(tqdm(batches, desc=f"epoch {epoch}", leave=False,
                                    disable=not (accelerator.is_local_main_process and sys.stderr.isatty()))):
        images = transform(split.images[idx].to(accelerator.device, non_blocking=True), generator)
        labels = split.labels[idx].to(accelerator.device, non_blocking=True)
        loss = objective(network(images), labels).mean()  # equal task weights
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"non-finite training loss ({loss.item()}) at epoch {epoch}, step {step}.")
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        optimizer.step()
        total += loss.detach()
        count += 1
    mean_loss = accelerator.reduce(total, reduction="mean").item() / max(count, 1)
    return {"loss": mean_loss, "steps": count}


@torch.no_grad()
def predict(
    accelerator: Accelerator, network: torch.nn.Module, split: SplitData, transform: BatchTransform, batch_size: int
) -> np.ndarray:
    """Flat logits (N, L) for every sample of ``split``, in data-set order, on every process.

    Each process predicts its shard; one gather collects (index, logits); padding is dropped by
    index, so nothing is duplicated or lost whatever the number of processes.
    """
    model = accelerator.unwrap_model(network)
    was_training = model.training
    model.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    indices, outputs = [], []
    for idx in eval_batch_indices(len(split), batch_size, rank, world):
        images = transform(split.images[idx].to(accelerator.device, non_blocking=True))
        outputs.append(model(images).float())
        indices.append(idx.to(accelerator.device))
    local_logits = torch.cat(outputs) if outputs else torch.zeros(0, device=accelerator.device)
    local_idx = torch.cat(indices)
    all_logits = accelerator.gather(local_logits).cpu().numpy()
    all_idx = accelerator.gather(local_idx).cpu().numpy()
    logits = np.empty((len(split), all_logits.shape[1]), dtype=np.float32)
    logits[all_idx] = all_logits  # padding repeats the last sample: same value written twice
    if len(np.unique(all_idx)) != len(split):
        raise RuntimeError(f"evaluation covered {len(np.unique(all_idx))} of {len(split)} samples.")
    model.train(was_training)
    return logits


def is_better(metric: str, value: float, best: float | None) -> bool:
    if best is None or math.isnan(best):
        return not math.isnan(value)
    return value > best if metric == "accuracy" else value < best
