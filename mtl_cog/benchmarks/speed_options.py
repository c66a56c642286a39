"""What ``train.precision`` and ``train.channels_last`` do to a training step here, measured side by side.

Whether bf16 autocast and the NHWC layout pay off depends on the machine: on a GPU they are the
fast path; on a CPU it depends on its instructions (AVX-512 BF16 / AMX) and on the network's
sizes (on the 2-core development machine, an AMD EPYC with AVX-512 BF16, the baseline's step of
the 17k-parameter ``cog_cnn_tiny`` was 1.70x faster with both at 16 px and 2.16x at 32 px). So it is
measured, not assumed: the baseline's step (the library's ``batch_loss`` + ``apply_update``) runs
under every combination, each its own trainee built by ``build_trainee`` from the same initial
weights through its own ``Accelerator`` (the mixed precision is Accelerate's, as in a run), and
the steps are interleaved in a rotating order on the same batches, so load from other processes
hits all alike. ``speedup`` is fp32-NCHW's median step time over each combination's.

Speed is half the question: whether a run's *results* stay the same under bf16 is a training
question (a sweep over ``train.precision`` with seeds, read by ``mtl-cog report``'s
``sweep_paired``; docs/results/real_images.md has the one that set the full-scale campaigns).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from accelerate.state import AcceleratorState

from mtl_cog.benchmarks.common import NUM_TASKS, Workload, binary_spec, interleaved_step_times, method_config
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.trainee import build_trainee


def combinations(on_gpu: bool) -> list[tuple[str, bool]]:
    """(precision, channels_last) pairs, fp32-NCHW first; fp16 only where it runs (CUDA)."""
    precisions = ["no", "bf16", *(["fp16"] if on_gpu else [])]
    return [(p, cl) for p in precisions for cl in (False, True)]


def label(precision: str, channels_last: bool) -> str:
    return ("fp32" if precision == "no" else precision) + ("+channels_last" if channels_last else "")


def _fresh_accelerator(precision: str):
    # Accelerate keeps one process-wide state and refuses another mixed precision once it is set; each
    # combination needs its own, and the trainee keeps its accelerator (its forward is wrapped at prepare).
    AcceleratorState._reset_state(reset_partial_state=True)
    return create_accelerator(None, precision)


def measure_speed_options(workload: Workload, methods_dir: Path, steps: int, warmup: int) -> dict:
    """Median step seconds of the baseline under each (precision, channels_last), and each one's speedup."""
    try:
        return _measure(workload, methods_dir, steps, warmup)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # the next section builds its own


def _measure(workload: Workload, methods_dir: Path, steps: int, warmup: int) -> dict:
    trainees = {}
    for precision, channels_last in combinations(torch.cuda.is_available()):
        cfg = method_config(methods_dir, "baseline", dataclasses.replace(
            workload, precision=precision, channels_last=channels_last))
        trainees[label(precision, channels_last)] = build_trainee(
            _fresh_accelerator(precision), cfg, binary_spec(NUM_TASKS).layout, seed=0)
    median = interleaved_step_times(trainees, workload, steps, warmup)
    device = next(iter(trainees.values())).accelerator.device
    reference = label("no", False)
    return {"speed_options": {
        "backbone": workload.backbone, "image_size": workload.image_size, "batch_size": workload.batch_size,
        "device": str(device), "steps": steps,
        "median_step_seconds": median,
        "speedup": {n: median[reference] / median[n] for n in trainees},
    }}
