"""One training epoch of the real loop on CelebA-sized tensors: images/s and the share of the GPU's peak.

``mtl_cog.training.step.train_one_epoch`` (the loop ``fit`` runs) trains COG-FC over
``images`` random uint8 images with 40 binary tasks, kept on the device as with
``train.images_on_device``, after a short untimed warm-up epoch. The training FLOPs per image
(forward + backward, ``torch.utils.flop_counter``) times images/s gives the achieved TFLOP/s,
compared with the card's dense bf16 peak from its data sheet. ``scripts/gpu_check.sh`` runs this
with ResNet-101 on 202,599 images at 32x32.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from mtl_cog.benchmarks.common import (
    NUM_TASKS,
    Workload,
    binary_spec,
    method_config,
    peak_rss_bytes,
    random_split,
    timed,
)
from mtl_cog.data.batches import BatchTransform, place_split
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.step import batch_loss, train_one_epoch
from mtl_cog.training.trainee import build_trainee

METHOD = "cog_fc"
# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets; most specific first.
BF16_PEAK_TFLOPS = {
    "GB200": 2500.0, "B200": 2250.0, "H200": 989.4, "GH200": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0,
    "H100": 989.4, "H800": 989.4, "A100": 312.0, "A800": 312.0, "L40S": 362.1, "L40": 181.0, "L4": 121.0,
    "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.2, "RTX 6000 Ada": 364.2, "RTX A6000": 154.8, "RTX 3090": 71.0,
}


def flops_per_image(network: torch.nn.Module, objective: torch.nn.Module, images: torch.Tensor,
                    labels: torch.Tensor) -> float:
    """Forward + backward FLOPs of one training step (``batch_loss`` and its backward) per image.

    Counted on the eager network, with ``torch.compile`` out of the way: a network compiled in place
    (``train.compile``) would otherwise have its first call here, under ``FlopCounterMode`` (a
    TorchDispatchMode), and torch 2.11's dynamo, meeting the mode, runs that frame eagerly and marks
    its code skipped for good, so the timed epoch never compiled. ``torch.compiler.disable`` around the
    count is no cure (the compiled call turns dynamo back on inside it), and counting after the epoch
    would still run the compiled code under the mode; so the count bypasses the compiled call.
    """
    with _eager_calls(network), FlopCounterMode(display=False) as counter:
        batch_loss(network, objective, images, labels).backward()
    network.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(images)


@contextmanager
def _eager_calls(network: torch.nn.Module) -> Iterator[None]:
    """Calls of ``network`` and its submodules skip what ``nn.Module.compile`` installed (its
    ``_compiled_call_impl``, which ``__call__`` prefers), so dynamo never sees them; restored on exit."""
    compiled = {module: module._compiled_call_impl for module in network.modules()
                if getattr(module, "_compiled_call_impl", None) is not None}
    for module in compiled:
        module._compiled_call_impl = None
    try:
        yield
    finally:
        for module, call in compiled.items():
            module._compiled_call_impl = call


def bf16_peak(device: torch.device, override: float | None) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it comes from): ``override``, else the data-sheet table by GPU name, else None."""
    if override:
        return override, "--peak-tflops"
    if device.type != "cuda":
        return None, "no GPU"
    name = torch.cuda.get_device_name(device)
    for key in sorted(BF16_PEAK_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return BF16_PEAK_TFLOPS[key], f"{name} (data sheet, dense bf16)"
    return None, f"{name}: unknown, pass --peak-tflops"


def epoch_check(workload: Workload, methods_dir: Path, images: int, warmup_steps: int,
                peak_tflops: float | None = None) -> dict:
    accelerator = create_accelerator(None, workload.precision)
    device = accelerator.device
    cfg = method_config(methods_dir, METHOD, workload)
    spec = binary_spec(NUM_TASKS, pad_crop=0, hflip=True)  # CelebA's augmentation
    trainee = build_trainee(accelerator, cfg, spec.layout, seed=0)  # what fit trains, prepared as fit prepares it
    data_seconds, split = timed(device, lambda: place_split(  # train.images_on_device: uint8 images stay on the GPU
        random_split(images, workload.image_size, NUM_TASKS, seed=0, device=device), device))
    transform = BatchTransform(spec, train=True, device=device)
    idx = torch.arange(min(workload.batch_size, images))
    with accelerator.autocast():
        flops = flops_per_image(trainee.model, trainee.objective, transform(split.images[idx]), split.labels[idx])

    def run_epoch(data, epoch: int) -> float:
        return timed(device, lambda: train_one_epoch(accelerator, trainee.network, trainee.objective,
                                                     trainee.optimizer, data, transform, workload.batch_size, 0,
                                                     epoch))[0]

    warmup = run_epoch(split.head(min(images, workload.batch_size * warmup_steps)), 0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = run_epoch(split, 1)
    rate = images / seconds
    achieved = flops * rate / 1e12
    peak, peak_source = bf16_peak(device, peak_tflops)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        **workload.describe(), "images": images, "method": METHOD, "tasks": NUM_TASKS,
        "epoch_seconds": seconds, "images_per_s": rate, "warmup_seconds": warmup, "data_seconds": data_seconds,
        "train_flops_per_image": flops, "achieved_tflops": achieved,
        "bf16_peak_tflops": peak, "peak_source": peak_source,
        "fraction_of_peak": achieved / peak if peak else None,
        "gpu_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_rss_bytes": peak_rss_bytes(),
    }
