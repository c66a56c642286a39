"""What every benchmark shares: the workload, method configs, random splits, timing, peak memory.

The benchmarks never carry their own training step nor their own assembly: a *trainee* is
``mtl_cog.training.trainee.build_trainee``'s, the one ``fit`` trains, and its step is the
library's (``batch_loss`` + ``apply_update``, the one ``train_one_epoch`` runs).
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from mtl_cog.config import Config, load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.errors import ConfigError
from mtl_cog.training.preflight import check_registered_names

NUM_TASKS = 40  # CelebA's attributes: the multi-task setting the speed targets are stated for
CELEBA_SPLITS = {"train": 162_770, "val": 19_867, "test": 19_962}  # 202,599 in all

T = TypeVar("T")


@dataclass(frozen=True)
class Workload:
    """The model and batch a measurement runs (the CLI flags of the same names)."""

    backbone: str = "cog_cnn_small"
    cifar_stem: bool = False
    image_size: int = 32
    batch_size: int = 128
    precision: str = "no"  # no | bf16 | fp16 (train.precision)
    channels_last: bool = False
    compile: bool = False

    def with_backbone(self, backbone: str) -> Workload:
        """Another backbone at the same sizes; 32x32 ResNets get the CIFAR stem (as configs/celeba does)."""
        return dataclasses.replace(self, backbone=backbone, cifar_stem=backbone.startswith("resnet"))

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def available_methods(methods_dir: Path) -> list[str]:
    return sorted(p.stem for p in methods_dir.glob("*.yaml"))


def method_config(methods_dir: Path, name: str, workload: Workload, overrides: list[str] | None = None) -> Config:
    """The shipped method config ``<methods_dir>/<name>.yaml`` with the workload's model and train settings.

    A method is a config file, not a code path: its calibrator, leader, loss and head (e.g.
    COG-TST's ``mlp`` head) come from the file; only backbone, sizes and speed options are the
    benchmark's, so every method is timed on the same network body and batch.
    """
    name, aggregation = split_aggregator(name)
    path = methods_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available_methods(methods_dir))
        raise ConfigError(f"unknown method {name!r}: there is no {path}. Available: {known}.")
    cfg = load_config(path, [*(overrides or []), *aggregation])
    cfg = dataclasses.replace(
        cfg, tracking="none",
        model=dataclasses.replace(cfg.model, backbone=workload.backbone, cifar_stem=workload.cifar_stem),
        data=dataclasses.replace(cfg.data, image_size=workload.image_size),
        train=dataclasses.replace(cfg.train, batch_size=workload.batch_size, precision=workload.precision,
                                  channels_last=workload.channels_last, compile=workload.compile),
    )
    cfg.validate()  # the workload's values pass the same checks as a config file's
    check_registered_names(cfg)  # an unregistered loss, head or calibrator fails before anything is timed
    return cfg


def split_aggregator(name: str) -> tuple[str, list[str]]:
    """``method[+aggregator[:features|parameters]]`` -> (method, its ``mtl.*`` overrides): a method under an
    aggregator (``baseline+upgrad``, ``cog_fc+mgda:parameters``) is timed like any method."""
    method, _, aggregator = name.partition("+")
    if not aggregator:
        return method, []
    aggregator, _, place = aggregator.partition(":")
    return method, [f"mtl.aggregator={aggregator}", *([f"mtl.aggregate_on={place}"] if place else [])]


def binary_spec(num_tasks: int = NUM_TASKS, pad_crop: int = 0, hflip: bool = True) -> TaskSpec:
    """A CelebA-like spec: ``num_tasks`` binary attributes, crop (``pad_crop``) and flip as asked."""
    names = tuple(f"attr{t:02d}" for t in range(num_tasks))
    return TaskSpec("bench", names, (2,) * num_tasks, (0.5,) * 3, (0.25,) * 3, pad_crop=pad_crop, hflip=hflip)


def random_split(n: int, size: int, num_tasks: int, seed: int, device: str | torch.device = "cpu") -> SplitData:
    """``n`` random uint8 images (3 x size x size) with random binary labels: cost, not accuracy, is measured."""
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=generator, device=device)
    labels = torch.randint(0, 2, (n, num_tasks), generator=generator, device=device)
    return SplitData(images, labels)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that a wall-clock interval covers the work it names."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, work: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds, result) of ``work()``, synchronised with the device on both ends."""
    sync(device)
    start = time.perf_counter()
    result = work()
    sync(device)
    return time.perf_counter() - start, result


BATCHES = 4  # distinct batches cycled through by an interleaved measurement (the same for every trainee)


def interleaved_step_times(trainees: dict, workload: Workload, steps: int, warmup: int) -> dict[str, float]:
    """Median seconds of one training step (crop + flip augmentation, then ``Trainee.step``) of each trainee.

    Every trainee runs the same ``BATCHES`` batches of 40 binary tasks; the steps are interleaved and the
    order rotates every step, so that load from other processes (or clock changes) hits all of them alike.
    The first ``warmup`` rounds are not timed.
    """
    device = next(iter(trainees.values())).accelerator.device
    spec = binary_spec(NUM_TASKS, pad_crop=workload.image_size // 8)  # crop + flip: the heaviest augmentation
    transform = BatchTransform(spec, train=True, device=device)
    data = random_split(workload.batch_size * BATCHES, workload.image_size, NUM_TASKS, seed=1)
    generator = torch.Generator().manual_seed(0)
    names = list(trainees)
    times: dict[str, list[float]] = {n: [] for n in names}
    for step in range(warmup + steps):
        idx = torch.arange(workload.batch_size) + (step % BATCHES) * workload.batch_size
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:  # rotate who goes first
            def one_step(name: str = name, idx: torch.Tensor = idx) -> torch.Tensor:
                images = transform(data.images[idx].to(device, non_blocking=True), generator)
                return trainees[name].step(images, data.labels[idx].to(device, non_blocking=True))

            seconds, _ = timed(device, one_step)
            if step >= warmup:
                times[name].append(seconds)
    return {n: statistics.median(t) for n, t in times.items()}


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    Linux's ``VmHWM`` belongs to the address space, so a fresh ``exec`` starts from zero;
    ``getrusage``'s ``ru_maxrss`` survives fork+exec and would report the parent's peak in a probe.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux, bytes on macOS
