"""Running a network over a split: flat logits for every sample, exact across processes."""

from __future__ import annotations

import numpy as np
import torch
from accelerate import Accelerator

from mtl_cog.data.batches import BatchTransform, eval_batch_indices
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.errors import NonFiniteOutputError
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import to_predictions


@torch.no_grad()
def predict(
    accelerator: Accelerator, network: torch.nn.Module, split: SplitData, transform: BatchTransform, batch_size: int
) -> np.ndarray:
    """Flat logits (N, L) for every sample of ``split``, in data-set order, on every process.

    Each process predicts its shard; one gather collects (index, logits); padding is dropped by
    index, so nothing is duplicated or lost whatever the number of processes (Accelerate's
    ``gather_for_metrics`` only drops the padding of batches from a prepared DataLoader).
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
    check_finite_logits(logits)  # the same gathered logits on every process: all stop together
    return logits


def check_finite_logits(logits: np.ndarray, where: str = "the network") -> None:
    """Refuse NaN or infinite logits: every probability and metric computed from them would be NaN.

    Trained weights never produce them (loading refuses non-finite weights and impossible running
    statistics, training stops at a non-finite loss), so they mean weights that are damaged in a way
    no range check sees, or a network that diverged.
    """
    if np.isfinite(logits).all():  # also the empty batch
        return
    bad = ~np.isfinite(logits).reshape(len(logits), -1).all(axis=1)
    if bad.any():
        raise NonFiniteOutputError(
            f"{where} produced NaN or infinite logits for {int(bad.sum())} of {len(logits)} images (first: image "
            f"{int(np.argmax(bad))}), so no probability or metric of them would be a number. Its weights are damaged "
            "or it diverged: retrain, or restore the run folder from a copy.")


def predict_split(accelerator: Accelerator, network: torch.nn.Module, spec: TaskSpec, split: SplitData,
                  batch_size: int) -> Predictions:
    """``predict`` with the evaluation preprocessing of ``spec``, as per-task ``Predictions``."""
    transform = BatchTransform(spec, train=False, device=accelerator.device)
    return to_predictions(spec, predict(accelerator, network, split, transform, batch_size), split)
