"""Step time of each training loss over cross-entropy's, measured side by side in one process.

    python -m mtl_cog.benchmarks.loss_step_ratio [--losses mbls fedlas fedlas_mbls margin margin_ce]
                                                 [--steps 30] [--batch-size 128] [--image-size 32]

Times the library's own step (``training.step.batch_loss`` + ``apply_update``) of ``cog_cnn_small``
with 40 binary task heads (the CelebA layout) for each loss, on the same initial weights and the
same batches; the losses' steps are interleaved in a rotating order so that load from other
processes hits all of them alike, and the figure is the ratio of median step times. Targets:
<= 1.10 for MbLS, FedLAS (+) and the margin-aware objective (docs/neighbour_methods.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtl_cog.config import MethodConfig, ModelConfig, OptimConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.network import build_network
from mtl_cog.objectives import OBJECTIVES, build_objective
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.optim import build_optimizer
from mtl_cog.training.step import apply_update, batch_loss

TARGETS = {"mbls": 1.10, "fedlas": 1.10, "fedlas_mbls": 1.10, "margin": 1.10}


def measure(losses: list[str], steps: int, warmup: int, batch_size: int, image_size: int, tasks: int = 40) -> dict:
    accelerator = create_accelerator()
    device = accelerator.device
    layout = LogitLayout((2,) * tasks)
    names = ["ce", *(name for name in losses if name != "ce")]
    trainees = {}
    for name in names:
        OBJECTIVES.get(name)  # an unknown name fails before any work
        torch.manual_seed(0)
        method = MethodConfig(loss=name, leader=[])
        network = build_network(ModelConfig(backbone="cog_cnn_small"), method, layout).to(device)
        objective = build_objective(layout, method).to(device)
        optimizer = build_optimizer(network, [], OptimConfig(), objective)
        trainees[name] = (network, objective, optimizer)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(4, batch_size, 3, image_size, image_size, generator=generator).to(device)
    labels = torch.randint(0, 2, (4, batch_size, tasks), generator=generator).to(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for step in range(warmup + steps):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:
            network, objective, optimizer = trainees[name]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            apply_update(accelerator, optimizer, batch_loss(network, objective, images[step % 4], labels[step % 4]))
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"device": str(device), "median_step_seconds": median,
            "ratio_over_ce": {name: median[name] / median["ce"] for name in names if name != "ce"}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--losses", nargs="+", default=["mbls", "fedlas", "fedlas_mbls", "margin", "margin_ce"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args(argv)
    result = measure(args.losses, args.steps, args.warmup, args.batch_size, args.image_size)
    print(f"device {result['device']}, cog_cnn_small, 40 binary tasks, batch {args.batch_size}, "
          f"{args.image_size}px, median of {args.steps} interleaved steps")
    print(f"{'loss':<12} {'step ms':>8} {'ratio':>6}  target")
    print(f"{'ce':<12} {1e3 * result['median_step_seconds']['ce']:>8.1f} {1.0:>6.3f}")
    for name, ratio in result["ratio_over_ce"].items():
        target = TARGETS.get(name)
        verdict = "" if target is None else f"<= {target:.2f} {'ok' if ratio <= target else 'MISSED'}"
        print(f"{name:<12} {1e3 * result['median_step_seconds'][name]:>8.1f} {ratio:>6.3f}  {verdict}")
    return result


if __name__ == "__main__":
    main()
