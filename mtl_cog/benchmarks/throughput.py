"""Training images/s of a named backbone: the baseline method's step, same batch and speed options.

The step ratios (``step_ratio.py``) say what a method adds; this says what the backbone costs,
so that epochs can be planned (e.g. ``--throughput-backbones resnet18,resnet50``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from mtl_cog.benchmarks.common import (
    NUM_TASKS,
    Workload,
    binary_spec,
    method_config,
    random_split,
    timed,
)
from mtl_cog.data.batches import BatchTransform
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.trainee import build_trainee


def measure_throughput(workload: Workload, methods_dir: Path, steps: int) -> dict:
    """Median images/s over ``steps`` timed steps of the baseline (the first, untimed, pays one-off allocations)."""
    cfg = method_config(methods_dir, "baseline", workload)
    accelerator = create_accelerator(None, workload.precision)
    device = accelerator.device
    spec = binary_spec(NUM_TASKS)
    trainee = build_trainee(accelerator, cfg, spec.layout, seed=0)
    transform = BatchTransform(spec, train=True, device=device)
    data = random_split(workload.batch_size, workload.image_size, NUM_TASKS, seed=2)
    images, labels = data.images.to(device), data.labels.to(device)
    generator = torch.Generator().manual_seed(0)
    durations = [timed(device, lambda: trainee.step(transform(images, generator), labels))[0] for _ in range(steps + 1)]
    return {"backbone": workload.backbone, "cifar_stem": workload.cifar_stem, "image_size": workload.image_size,
            "batch_size": workload.batch_size, "value": workload.batch_size / statistics.median(durations[1:]),
            "steps": steps}
