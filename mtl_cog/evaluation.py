"""From network outputs to scored prediction files: shared by training and ``scripts/evaluate.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from mtl_cog import rundir
from mtl_cog.checkpoint import load_model
from mtl_cog.config import Config
from mtl_cog.data import BatchTransform
from mtl_cog.engine import predict
from mtl_cog.metrics import compute_metrics
from mtl_cog.models import build_network
from mtl_cog.predictions import Predictions
from mtl_cog.task_api import SplitData, TaskData, TaskSpec, load_task


def to_predictions(spec: TaskSpec, flat_logits: np.ndarray, split: SplitData) -> Predictions:
    """Flat (N, L) logits + the split's labels -> per-task ``Predictions``."""
    labels = split.labels.numpy()
    probs = None if split.true_probs is None else [split.true_probs[:, t] for t in range(spec.num_tasks)]
    return Predictions(
        task_names=list(spec.task_names),
        logits=spec.layout.split(flat_logits),
        labels=[labels[:, t] for t in range(spec.num_tasks)],
        true_probs=probs,
    )


def score(predictions: Predictions, bins: list[int]) -> dict[str, dict]:
    return compute_metrics(predictions.task_names, predictions.logits, predictions.labels, bins)


def predict_split(accelerator: Accelerator, network: torch.nn.Module, spec: TaskSpec, split: SplitData,
                  batch_size: int) -> Predictions:
    transform = BatchTransform(spec, train=False, device=accelerator.device)
    return to_predictions(spec, predict(accelerator, network, split, transform, batch_size), split)


def load_trained_run(accelerator: Accelerator, run_dir: str | Path) -> tuple[Config, TaskData, torch.nn.Module]:
    """Config, data and the best checkpoint of a finished run, ready for prediction."""
    run_dir = Path(run_dir)
    cfg = rundir.load_run_config(run_dir)
    with accelerator.main_process_first():
        task_data = load_task(cfg.data)
    network = build_network(cfg.model, cfg.method, task_data.spec.layout)
    if cfg.two_stage.enabled:  # TST / V-TST: the checkpoint holds the second-stage head
        from mtl_cog.two_stage import attach_second_stage_head

        network = attach_second_stage_head(network, cfg.two_stage, task_data.spec.layout)
    load_model(run_dir / rundir.BEST_MODEL, network)
    return cfg, task_data, network.to(accelerator.device)
