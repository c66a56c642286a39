"""Training-step cost of each method over the baseline's, measured side by side.

COG's promise (paper Sec. 3) is that calibrating in one go costs what standard training costs:
leader and follower are two parameter groups of one optimiser, updated from one backward pass.
This measurement times the library's own step (``batch_loss`` + ``apply_update``, what
``train_one_epoch`` runs, plus the batch augmentation) for every method named, on the same
initial backbone and the same batches. Steps of the methods are interleaved in a rotating order
so that load from other processes hits all of them alike; the figure is the ratio of medians.

A method is a config file in ``configs/methods/``, so a method added later is timed by naming it
(``--method baseline,cog_fc,cog_ts,mbls``). Targets: COG-FC and COG-TS add no work beyond a
second parameter group (and one division per logit for COG-TS): <= 1.03. Any other method may
legitimately add work (a larger head, a second loss term): <= 1.10.

A method under a multi-task aggregator is named ``method+aggregator`` (``baseline+upgrad``;
``baseline+mgda:parameters`` for the Gramian on the backbone's parameters), so every aggregator's
step is timed over equal weights' in the same rotation, both places side by side. Targets: with the
Gramian on the shared features (a representation-level heuristic, docs/guides/mtl.md) <= 1.30; on the
parameters (exact: the aggregator's guarantee holds for the backbone's update) <= 3.0 at 40 tasks.
The exact Gramian needs the T per-task gradients through the backbone: T backward passes on a CPU
(about 21x an equal-weights step at 40 tasks, the floor of any exact method; one vmapped backward of
the T cotangents took twice that there), one vmapped backward on an accelerator;
``torchjd.autogram.Engine`` computes the same Gramian layer by layer, but refuses BatchNorm backbones
with ``batch_dim`` and is slower without it (docs/guides/mtl.md, "Cost"). The timed step checks no conflict
(``mtl/conflict_rate``): on the parameters that check is free, on the features it runs every
``mtl.conflict_every`` steps.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from mtl_cog.benchmarks.common import (
    NUM_TASKS,
    Workload,
    binary_spec,
    interleaved_step_times,
    method_config,
    random_split,
    timed,
)
from mtl_cog.data.batches import BatchTransform
from mtl_cog.errors import ConfigError
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.trainee import Trainee, build_trainee

REFERENCE = "baseline"  # every ratio is over standard training's step
DEFAULT_METHODS = ("baseline", "cog_fc", "cog_ts")
STEP_RATIO_TARGETS = {"cog_fc": 1.03, "cog_ts": 1.03}
OTHER_METHOD_TARGET = 1.10


AGGREGATOR_TARGET = 1.30  # an aggregator on the shared features (heuristic): one Jacobian through the heads
EXACT_AGGREGATOR_TARGET = 3.0  # on the backbone's parameters (exact), at 40 tasks


def step_ratio_target(method: str) -> float | None:
    if "+" in method:
        return EXACT_AGGREGATOR_TARGET if method.endswith(":parameters") else AGGREGATOR_TARGET
    return STEP_RATIO_TARGETS.get(method, OTHER_METHOD_TARGET)


def ratio_key(method: str) -> str:
    return f"{method}_step_ratio"


def methods_to_time(methods: list[str]) -> list[str]:
    """``methods`` with the reference first and no name twice; an empty list is refused."""
    names = [m.strip() for m in methods if m.strip()]
    if not names:
        raise ConfigError("--method names no method (e.g. --method baseline,cog_fc,cog_ts).")
    if len(set(names)) != len(names):
        raise ConfigError(f"--method names a method twice: {','.join(names)}.")
    return [REFERENCE, *(m for m in names if m != REFERENCE)]


def measure_step_ratios(workload: Workload, methods_dir: Path, methods: list[str], steps: int, warmup: int,
                        profile_steps: int = 0) -> dict:
    """Median step time per method, each method's ratio over the baseline's, and the baseline's images/s."""
    names = methods_to_time(methods)
    configs = {m: method_config(methods_dir, m, workload) for m in names}  # unknown names fail before any work
    accelerator = create_accelerator(None, workload.precision)
    device = accelerator.device
    spec = binary_spec(NUM_TASKS)
    trainees = {m: build_trainee(accelerator, cfg, spec.layout, seed=0) for m, cfg in configs.items()}
    median = interleaved_step_times(trainees, workload, steps, warmup)
    profiled = [m for m in ("cog_ts", names[-1]) if m in trainees][0]
    top_ops = profile_top_ops(trainees[profiled], workload, profile_steps)
    result = {
        "median_step_seconds": median,
        "step_ratio_targets": {m: step_ratio_target(m) for m in names if m != REFERENCE},
        "steps_per_method": steps,
        "images_per_s": {**workload.describe(), "device": str(device),
                         "value": workload.batch_size / median[REFERENCE]},
        f"profile_{profiled}_step": top_ops,
    }
    result.update({ratio_key(m): median[m] / median[REFERENCE] for m in names if m != REFERENCE})
    result["per_task_gradients"] = {m: gradient_path(t) for m, t in trainees.items() if t.aggregation is not None}
    return result


def gradient_path(trainee: Trainee) -> str:
    """How an aggregator's per-task gradients were taken in the timed steps (``aggregated_step.per_task_gradients``):
    one vmapped backward, or one backward per task (on a CPU through the parameters, or after vmap failed)."""
    aggregation = trainee.aggregation
    on_cpu = trainee.accelerator.device.type == "cpu"
    if aggregation.batched and not (aggregation.on == "parameters" and on_cpu):
        return "vmapped"
    return "one backward per task" + (" (the CPU path)" if aggregation.batched else " (vmap failed and fell back)")


def profile_top_ops(trainee: Trainee, workload: Workload, steps: int) -> list | None:
    """torch.profiler over ``steps`` steps: the 20 ops with the most self time (None when steps is 0)."""
    if not steps:
        return None
    spec = binary_spec(NUM_TASKS, pad_crop=workload.image_size // 8)  # the timed steps' augmentation
    transform = BatchTransform(spec, train=True, device=trainee.accelerator.device)
    data = random_split(workload.batch_size, workload.image_size, NUM_TASKS, seed=1)
    batch_size = workload.batch_size
    device = trainee.accelerator.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    idx = torch.arange(batch_size)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            timed(device, lambda: trainee.step(transform(data.images[idx].to(device)), data.labels[idx].to(device)))
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    total = sum(getattr(e, key) for e in averages) or 1.0
    events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:20]
    return [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3 / steps,
             "share": getattr(e, key) / total} for e in events]
