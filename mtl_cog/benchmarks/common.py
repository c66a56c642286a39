"""What every benchmark shares: the workload, method configs, random splits, timing, peak memory.

The benchmarks never carry their own training step: a *trainee* here is only the network,
objective and optimiser that ``mtl_cog.training.step.batch_loss`` + ``apply_update`` (the
library's step, the one ``train_one_epoch`` runs) are timed on.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import Accelerator

from mtl_cog.config import Config, load_config
from mtl_cog.data.task_api import LogitLayout, SplitData, TaskSpec
from mtl_cog.errors import ConfigError
from mtl_cog.models.network import build_network
from mtl_cog.objectives import build_objective, set_partial_labels
from mtl_cog.objectives.aggregators import build_aggregator
from mtl_cog.training import step as training_step
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss
from mtl_cog.training.optim import build_optimizer
from mtl_cog.training.preflight import check_registered_names
from mtl_cog.training.speed import apply_speed_options

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


@dataclass
class Trainee:
    """One method's prepared network, objective and optimiser (what the library's step is timed on)."""

    accelerator: Accelerator
    network: torch.nn.Module
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    aggregation: Aggregation | None = None  # mtl.aggregator other than equal

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``batch_loss`` (or ``aggregated_loss``) then ``apply_update``: exactly one step of ``train_one_epoch``."""
        if self.aggregation is None:
            loss = to_backward = training_step.batch_loss(self.network, self.objective, images, labels)
        else:
            shared = [p for p in self.accelerator.unwrap_model(self.network).backbone.parameters() if p.requires_grad]
            out = aggregated_loss(self.accelerator, self.network, self.objective, self.aggregation, images, labels,
                                  shared)
            loss, to_backward = out.loss, out.backward
        training_step.apply_update(self.accelerator, self.optimizer, to_backward)
        return loss.detach()


def build_trainee(accelerator: Accelerator, cfg: Config, layout: LogitLayout, seed: int = 0) -> Trainee:
    """Network, objective and optimiser of ``cfg`` as ``fit`` builds them; the same initial backbone per seed."""
    torch.manual_seed(seed)
    network = apply_speed_options(build_network(cfg.model, cfg.method, layout), cfg.train)
    objective = build_objective(layout, cfg.method).to(accelerator.device)
    set_partial_labels(objective, False)  # as fit, for fully labelled data: no per-batch look for missing labels
    aggregator = build_aggregator(cfg.mtl.aggregator, layout.num_tasks)
    if aggregator is not None:  # as fit: its learned parts train with the loss's
        objective.add_module("aggregator", aggregator.to(accelerator.device))
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim, objective)  # as fit: + the loss's parameters
    network, optimizer = accelerator.prepare(network, optimizer)
    aggregation = Aggregation(aggregator, cfg.mtl.aggregate_on) if aggregator is not None else None
    return Trainee(accelerator, network, objective, optimizer, aggregation)


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
