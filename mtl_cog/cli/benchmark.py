"""Speed and scale benchmark: COG's step cost, the data pipeline, time to a calibrated model, metrics.

    python scripts/benchmark.py --out bench.json                 # the full CPU/GPU benchmark
    python scripts/benchmark.py --quick --out bench.json         # seconds; what the test suite runs
    python scripts/benchmark.py --epoch-check --out epoch.json   # one epoch on CelebA-sized tensors
                                                                 # (scripts/gpu_check.sh calls this)

Everything is measured side by side in one process on the same model and batch, and written as
JSON (plus a printed table):

- ``cog_fc_step_ratio`` / ``cog_ts_step_ratio``: median training-step time of COG-FC / COG-TS over
  the baseline's; steps of the three methods are interleaved (rotating order) so that load from
  other processes hits all of them alike. Target <= 1.03.
- ``loader_speedup``: images/s of the cached pipeline (memory-mapped uint8 cache, batched
  crop+flip, normalisation) over a torchvision + PIL ``DataLoader`` with 2 workers reading the same
  CelebA-format JPEG folder (official layout, >= 2,000 images). Target >= 30.
- ``calibrated_model_time_ratio``: wall time to a calibrated 40-task model with COG-FC over the
  baseline + 40 post-hoc temperature fits (probmetrics) + a TST second stage, same epochs.
- ``images_per_s`` of training (backbone, image size, batch named), ``peak_rss_bytes`` (and GPU
  memory on CUDA), ``eval_seconds`` (all metrics, 40 tasks x 20,000 samples x 5 bin counts),
  ``cache_memory``: peak RSS of a CelebA-sized (202,599 x 3 x 32 x 32) cache read for a whole
  epoch, above the model's own (target <= 1 GiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

import tasks  # noqa: F401  (registers the data sets)
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, TrainConfig, load_config
from mtl_cog.data.batches import BatchTransform, place_split, train_batch_indices
from mtl_cog.data.cache import read_cache, write_cache
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import LogitLayout, SplitData, TaskData, TaskSpec
from mtl_cog.errors import run_cli
from mtl_cog.evaluation.inference import predict
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.io import atomic_write_json
from mtl_cog.models.network import build_network
from mtl_cog.objectives import build_objective
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.optim import build_optimizer
from mtl_cog.training.speed import apply_speed_options
from mtl_cog.training.step import train_one_epoch
from tasks.celeba import MEAN, STD, read_attributes
from tasks.fixtures import CELEBA_ATTRIBUTES

METHODS = ("baseline", "cog_fc", "cog_ts")
NUM_TASKS = 40
CELEBA_SPLITS = {"train": 162_770, "val": 19_867, "test": 19_962}  # 202,599 in all
BINS = [5, 10, 15, 20, 50]
# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets; most specific first.
BF16_PEAK_TFLOPS = {
    "GB200": 2500.0, "B200": 2250.0, "H200": 989.4, "GH200": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0,
    "H100": 989.4, "H800": 989.4, "A100": 312.0, "A800": 312.0, "L40S": 362.1, "L40": 181.0, "L4": 121.0,
    "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.2, "RTX 6000 Ada": 364.2, "RTX A6000": 154.8, "RTX 3090": 71.0,
}


# ------------------------------------------------------------------------------------ utilities


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def method_config(name: str) -> MethodConfig:
    """The shipped method config (a method is a config file, not a code path)."""
    return load_config(CONFIGS / "methods" / f"{name}.yaml").method


def binary_spec(num_tasks: int, pad_crop: int = 0, hflip: bool = True) -> TaskSpec:
    names = tuple(f"attr{t:02d}" for t in range(num_tasks))
    return TaskSpec("bench", names, (2,) * num_tasks, (0.5,) * 3, (0.25,) * 3, pad_crop=pad_crop, hflip=hflip)


def model_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(backbone=args.backbone, cifar_stem=args.cifar_stem)


def train_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(batch_size=args.batch_size, precision=args.precision, channels_last=args.channels_last,
                       compile=args.compile)


def random_split(n: int, size: int, num_tasks: int, seed: int, device: str | torch.device = "cpu") -> SplitData:
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g, device=device)
    labels = torch.randint(0, 2, (n, num_tasks), generator=g, device=device)
    return SplitData(images, labels)


# ------------------------------------------------------------------- COG step cost vs baseline


class Trainee:
    """One method's network, objective and optimiser, prepared by the accelerator; one step at a time.

    The step is the body of ``mtl_cog.training.step.train_one_epoch`` (transform, forward, per-task loss
    mean, zero_grad, backward, optimiser step), repeated here so that each step can be timed.
    """

    def __init__(self, accelerator, method: str, args: argparse.Namespace, layout: LogitLayout) -> None:
        torch.manual_seed(0)  # the same initial backbone for every method
        method_cfg = method_config(method)
        network = apply_speed_options(build_network(model_config(args), method_cfg, layout), train_config(args))
        optimizer = build_optimizer(network, method_cfg.leader, OptimConfig())
        self.network, self.optimizer = accelerator.prepare(network, optimizer)
        self.objective = build_objective(layout, method_cfg).to(accelerator.device)
        self.accelerator = accelerator

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = self.objective(self.network(images), labels).mean()
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.backward(loss)
        self.optimizer.step()
        return loss.detach()


def measure_step_ratios(args: argparse.Namespace) -> dict:
    accelerator = create_accelerator(None, args.precision)
    device = accelerator.device
    spec = binary_spec(NUM_TASKS, pad_crop=args.image_size // 8)
    layout = spec.layout
    trainees = {m: Trainee(accelerator, m, args, layout) for m in METHODS}
    transform = BatchTransform(spec, train=True, device=device)
    data = random_split(args.batch_size * 4, args.image_size, NUM_TASKS, seed=1)
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for step in range(args.warmup + args.steps):
        idx = torch.arange(args.batch_size) + (step % 4) * args.batch_size  # same batch for all methods
        order = METHODS[step % 3:] + METHODS[: step % 3]  # rotate who goes first
        for method in order:
            sync(device)
            start = time.perf_counter()
            images = transform(data.images[idx].to(device, non_blocking=True), generator)
            trainees[method].step(images, data.labels[idx].to(device, non_blocking=True))
            sync(device)
            if step >= args.warmup:
                times[method].append(time.perf_counter() - start)
    median = {m: statistics.median(t) for m, t in times.items()}
    profile = profile_steps(trainees["cog_ts"], transform, data, args) if args.profile else None
    del trainees
    return {
        "median_step_seconds": median,
        "cog_fc_step_ratio": median["cog_fc"] / median["baseline"],
        "cog_ts_step_ratio": median["cog_ts"] / median["baseline"],
        "steps_per_method": args.steps,
        "images_per_s": {"backbone": args.backbone, "cifar_stem": args.cifar_stem, "image_size": args.image_size,
                         "batch_size": args.batch_size, "precision": args.precision,
                         "channels_last": args.channels_last, "device": str(device),
                         "value": args.batch_size / median["baseline"]},
        "profile_cog_ts_step": profile,
    }


def profile_steps(trainee: Trainee, transform: BatchTransform, data: SplitData, args: argparse.Namespace) -> list:
    """torch.profiler over a few COG-TS steps: the ops with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    idx = torch.arange(args.batch_size)
    device = trainee.accelerator.device
    with profile(activities=activities) as prof:
        for _ in range(args.profile):
            trainee.step(transform(data.images[idx].to(device)), data.labels[idx].to(device))
    sync(device)
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:20]
    total = sum(getattr(e, key) for e in prof.key_averages())
    return [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3 / args.profile,
             "share": getattr(e, key) / total} for e in events]


def measure_throughput(backbone: str, args: argparse.Namespace, steps: int) -> dict:
    """Training images/s of another named backbone (baseline method, same batch and options)."""
    stem = backbone.startswith("resnet")  # 32x32 ResNets use the CIFAR stem (as configs/celeba does)
    local = argparse.Namespace(**{**vars(args), "backbone": backbone, "cifar_stem": stem})
    accelerator = create_accelerator(None, args.precision)
    spec = binary_spec(NUM_TASKS)
    trainee = Trainee(accelerator, "baseline", local, spec.layout)
    transform = BatchTransform(spec, train=True, device=accelerator.device)
    data = random_split(args.batch_size, args.image_size, NUM_TASKS, seed=2)
    images, labels = data.images.to(accelerator.device), data.labels.to(accelerator.device)
    durations = []
    for step in range(steps + 1):
        sync(accelerator.device)
        start = time.perf_counter()
        trainee.step(transform(images), labels)
        sync(accelerator.device)
        if step:  # the first step pays one-off allocations
            durations.append(time.perf_counter() - start)
    return {"backbone": backbone, "cifar_stem": stem, "image_size": args.image_size, "batch_size": args.batch_size,
            "value": args.batch_size / statistics.median(durations), "steps": steps}


# ------------------------------------------------------------------------ the data pipeline


def write_celeba_folder(root: Path, n: int, seed: int = 0) -> Path:
    """``<root>/celeba`` in the official layout with ``n`` 178x218 JPEGs.

    Like tests/fixtures.py ``write_celeba``, but the pictures are smooth colour fields with mild
    noise, so that the JPEGs have the size (~8.7 KiB; real ones average ~8.5) and decode cost of real faces rather
    than of white noise (which would flatter the cached pipeline).
    """
    rng = np.random.default_rng(seed)
    folder = root / "celeba"
    (folder / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(1, n + 1)]
    for name in names:
        coarse = torch.from_numpy(rng.uniform(0, 255, (1, 3, 6, 5)).astype(np.float32))
        smooth = torch.nn.functional.interpolate(coarse, size=(218, 178), mode="bicubic", align_corners=False)[0]
        pixels = (smooth + torch.from_numpy(rng.normal(0, 4, smooth.shape).astype(np.float32))).clamp(0, 255)
        Image.fromarray(pixels.permute(1, 2, 0).to(torch.uint8).numpy()).save(folder / "img_align_celeba" / name,
                                                                               quality=90)
    values = rng.choice(np.array([-1, 1]), size=(n, len(CELEBA_ATTRIBUTES)))
    lines = [str(n), " ".join(CELEBA_ATTRIBUTES)] + [name + "".join(f" {v:2d}" for v in row)
                                                     for name, row in zip(names, values)]
    (folder / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    # contiguous blocks as in the official file: 80 % train, 10 % val, 10 % test
    codes = np.repeat([0, 1, 2], [n - 2 * (n // 10), n // 10, n // 10])
    (folder / "list_eval_partition.txt").write_text("".join(f"{nm} {c}\n" for nm, c in zip(names, codes)))
    return folder


class JpegFolder(torch.utils.data.Dataset):
    """The usual per-image pipeline: PIL decode, torchvision transforms, one sample at a time."""

    def __init__(self, folder: Path, names: list[str], labels: np.ndarray, transform) -> None:
        self.folder, self.names, self.labels, self.transform = folder, names, labels, transform

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(self.folder / "img_align_celeba" / self.names[i]) as img:
            return self.transform(img.convert("RGB")), self.labels[i]


def torchvision_loader_rate(folder: Path, names: list[str], size: int, pad: int, batch: int, epochs: int) -> float:
    from torchvision import transforms as T


    _, _, labels = read_attributes(folder / "list_attr_celeba.txt")
    transform = T.Compose([T.Resize(size), T.CenterCrop(size), T.RandomCrop(size, padding=pad),
                           T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = torch.utils.data.DataLoader(JpegFolder(folder, names, labels, transform), batch_size=batch,
                                         shuffle=True, num_workers=2, persistent_workers=True, drop_last=False)
    for _ in loader:  # the first epoch starts the workers: not counted (generous to the baseline)
        pass
    start, count = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            count += len(images)
    return count / (time.perf_counter() - start)


def cached_pipeline_rate(split: SplitData, spec: TaskSpec, batch: int, min_seconds: float) -> float:
    """Images/s of the cached path as training uses it: shuffled index batches -> gather -> augment."""
    transform = BatchTransform(spec, train=True)
    generator = torch.Generator().manual_seed(0)
    start, count, epoch = time.perf_counter(), 0, 0
    while time.perf_counter() - start < min_seconds:
        epoch += 1
        for idx in train_batch_indices(len(split), batch, 0, 1, seed=0, epoch=epoch):
            images = transform(split.images[idx], generator)
            _labels = split.labels[idx]
            count += len(images)
    return count / (time.perf_counter() - start)


def measure_loader(args: argparse.Namespace, work: Path) -> dict:
    start = time.perf_counter()
    folder = write_celeba_folder(work, args.jpeg_images)
    written = time.perf_counter() - start
    data_cfg = DataConfig(task="celeba", root=str(work), image_size=args.image_size, cache_dir=str(work / "cache"))
    start = time.perf_counter()
    task_data = load_task(data_cfg)  # decodes once and writes the cache
    build_seconds = time.perf_counter() - start
    train = task_data.splits["train"]
    pad = args.image_size // 8
    spec = dataclasses.replace(task_data.spec, pad_crop=pad)  # crop + flip: the heaviest augmentation we offer
    names = [p.split()[0] for p in (folder / "list_eval_partition.txt").read_text().splitlines() if p.endswith(" 0")]
    tv_rate = torchvision_loader_rate(folder, names, args.image_size, pad, args.batch_size, args.loader_epochs)
    cached_rate = cached_pipeline_rate(train, spec, args.batch_size, min_seconds=args.loader_seconds)
    jpeg_kib = sum(f.stat().st_size for f in (folder / "img_align_celeba").iterdir()) / args.jpeg_images / 1024
    return {
        "loader_speedup": cached_rate / tv_rate,
        "cached_images_per_s": cached_rate,
        "torchvision_images_per_s": tv_rate,
        "jpeg_folder": {"images": args.jpeg_images, "train_images": len(names), "mean_jpeg_kib": jpeg_kib,
                        "write_seconds": written},
        "cache_build_seconds": build_seconds,
        "augmentation": f"pad {pad} + random crop {args.image_size}, horizontal flip, normalise",
        "torchvision_workers": 2,
    }


# ------------------------------------------------------------------ time to a calibrated model


class TSTHeadStack(nn.Module):
    """Benchmark-local stand-in for the TST second stage (issue 3's module is not on this branch).

    The frozen backbone (eval mode, no gradients) feeds a fresh head stack
    Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, L) with Z = d, trained for the same epochs:
    the cost structure of TST's second stage (Joy et al., 2023, as used in the COG paper).
    """

    def __init__(self, backbone: nn.Module, num_logits: int) -> None:
        super().__init__()
        d = backbone.num_features
        self.backbone = backbone.eval().requires_grad_(False)
        self.heads = nn.Sequential(nn.Linear(d, 3 * d), nn.ReLU(), nn.Linear(3 * d, d), nn.Linear(d, num_logits))
        self.calibrator = nn.Identity()

    def train(self, mode: bool = True) -> TSTHeadStack:
        super().train(mode)
        self.backbone.eval()  # BatchNorm statistics stay frozen (DESIGN.md section 8)
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(images)
        return self.heads(features)


def _timed_training(accelerator, network, method_cfg, split, spec, args) -> float:
    optimizer = build_optimizer(network, method_cfg.leader, OptimConfig())
    network, optimizer = accelerator.prepare(network, optimizer)
    objective = build_objective(spec.layout, method_cfg).to(accelerator.device)
    transform = BatchTransform(spec, train=True, device=accelerator.device)
    sync(accelerator.device)
    start = time.perf_counter()
    for epoch in range(1, args.cal_epochs + 1):
        train_one_epoch(accelerator, network, objective, optimizer, split, transform, args.batch_size, 0, epoch)
    sync(accelerator.device)
    return time.perf_counter() - start


def fit_temperatures(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """One post-hoc temperature per binary task with probmetrics (input columns [0, z])."""
    from probmetrics.calibrators import TemperatureScalingCalibrator
    from probmetrics.distributions import CategoricalLogits

    inverse = []
    for t in range(logits.shape[1]):
        z = torch.as_tensor(logits[:, t], dtype=torch.float32)
        two_columns = CategoricalLogits(torch.stack([torch.zeros_like(z), z], dim=1))
        calibrator = TemperatureScalingCalibrator()
        calibrator.fit_torch(two_columns, torch.as_tensor(labels[:, t], dtype=torch.long))
        inverse.append(float(calibrator.invtemp_))
    return np.asarray(inverse)


def measure_calibrated_time(args: argparse.Namespace) -> dict:
    """Wall time to a calibrated 40-task model: COG-FC vs baseline + 40 temperature fits + TST stage."""
    accelerator = create_accelerator(None, args.precision)
    spec = binary_spec(NUM_TASKS)
    train = random_split(args.cal_train, args.image_size, NUM_TASKS, seed=3)
    val = random_split(args.cal_val, args.image_size, NUM_TASKS, seed=4)
    model_cfg = model_config(args)

    def network_for(method: str):
        torch.manual_seed(0)
        return apply_speed_options(build_network(model_cfg, method_config(method), spec.layout), train_config(args))

    cog_seconds = _timed_training(accelerator, network_for("cog_fc"), method_config("cog_fc"), train, spec, args)

    baseline = network_for("baseline")
    base_seconds = _timed_training(accelerator, baseline, method_config("baseline"), train, spec, args)
    start = time.perf_counter()
    val_logits = predict(accelerator, baseline, val, BatchTransform(spec, train=False, device=accelerator.device),
                         args.batch_size * 2)
    fit_temperatures(val_logits, val.labels.numpy())
    posthoc_seconds = time.perf_counter() - start
    tst = TSTHeadStack(accelerator.unwrap_model(baseline).backbone, spec.layout.total)
    tst_method = dataclasses.replace(method_config("baseline"), leader=[])
    tst_seconds = _timed_training(accelerator, tst, tst_method, train, spec, args)
    two_stage = base_seconds + posthoc_seconds + tst_seconds
    return {
        "calibrated_model_time_ratio": cog_seconds / two_stage,
        "cog_fc_seconds": cog_seconds,
        "baseline_train_seconds": base_seconds,
        "posthoc_40_temperature_fits_seconds": posthoc_seconds,
        "tst_second_stage_seconds": tst_seconds,
        "tst_second_stage": "benchmark-local equivalent: frozen backbone in eval mode + fresh head stack "
                            "Linear(d,3d)-ReLU-Linear(3d,d)-Linear(d,40), same epochs (issue 3 module absent)",
        "setup": {"backbone": args.backbone, "train_images": args.cal_train, "val_images": args.cal_val,
                  "epochs": args.cal_epochs, "batch_size": args.batch_size, "tasks": NUM_TASKS},
    }


# ------------------------------------------------------------------------------- evaluation


def measure_eval(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(0)
    n = args.eval_samples
    logits = [rng.normal(0, 2, n).astype(np.float32) for _ in range(NUM_TASKS)]
    labels = [(rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64) for z in logits]
    names = [f"attr{t:02d}" for t in range(NUM_TASKS)]
    durations = []
    for _ in range(3):
        start = time.perf_counter()
        compute_metrics(names, logits, labels, BINS)
        durations.append(time.perf_counter() - start)
    return {"eval_seconds": statistics.median(durations), "tasks": NUM_TASKS, "samples": n, "bins": BINS}


# --------------------------------------------------------------------------- cache memory


def memory_probe(kind: str, folder: Path, args: argparse.Namespace) -> dict:
    """Run in a fresh process; returns its peak RSS. kind: build | model | cache."""
    if kind == "build":
        splits = {name: random_split(n, args.image_size, NUM_TASKS, seed=i)
                  for i, (name, n) in enumerate(args.cache_sizes.items())}
        write_cache(folder, TaskData(binary_spec(NUM_TASKS), splits), {"benchmark": True}, show_progress=False)
        return {"peak_rss_bytes": peak_rss_bytes()}
    spec = binary_spec(NUM_TASKS)
    accelerator = create_accelerator(None, "no")
    trainee = Trainee(accelerator, "cog_fc", args, spec.layout)
    transform = BatchTransform(spec, train=True)
    generator = torch.Generator().manual_seed(0)
    if kind == "cache":
        cached = read_cache(folder, None)
        if cached is None:
            raise RuntimeError(f"no cache in {folder}")
        split = cached.splits["train"]
    else:
        split = random_split(args.batch_size, args.image_size, NUM_TASKS, seed=0)
    touched = 0
    for step, idx in enumerate(train_batch_indices(len(split), args.batch_size, 0, 1, seed=0, epoch=1)):
        images, labels = transform(split.images[idx], generator), split.labels[idx]
        touched += len(idx)
        if step < 3:  # a few real steps so that the model's own peak (activations, Adam state) is in
            trainee.step(images, labels)
    if kind == "cache":  # an epoch also evaluates validation and test: every page of the cache is read
        evaluation = BatchTransform(spec, train=False)
        for name in ("val", "test"):
            other = cached.splits[name]
            for start in range(0, len(other), 4 * args.batch_size):
                evaluation(other.images[start : start + 4 * args.batch_size])
                touched += len(other.images[start : start + 4 * args.batch_size])
    return {"peak_rss_bytes": peak_rss_bytes(), "images_read": touched}


def measure_cache_memory(args: argparse.Namespace, work: Path) -> dict:
    folder = work / "celeba_sized_cache"
    results = {}
    for kind in ("build", "model", "cache"):
        command = [sys.executable, __file__, "--memory-probe", kind, "--probe-dir", str(folder),
                   "--backbone", args.backbone, "--batch-size", str(args.batch_size), "--image-size",
                   str(args.image_size), "--cache-images", str(args.cache_images)]
        if args.cifar_stem:
            command.append("--cifar-stem")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"memory probe {kind} failed:\n{done.stderr[-3000:]}")
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    size = sum(np.load(f, mmap_mode="r").nbytes for f in folder.glob("*.images.npy"))  # without .npy headers
    extra = results["cache"]["peak_rss_bytes"] - results["model"]["peak_rss_bytes"]
    return {
        "images": sum(args.cache_sizes.values()),
        "image_bytes": size,
        "model_only_peak_rss_bytes": results["model"]["peak_rss_bytes"],
        "model_plus_cache_epoch_peak_rss_bytes": results["cache"]["peak_rss_bytes"],
        "cache_extra_rss_bytes": extra,
        "within_1GiB": extra <= 2**30,
        "images_read": results["cache"]["images_read"],
        "build_peak_rss_bytes": results["build"]["peak_rss_bytes"],
        "backbone": args.backbone,
    }


# ------------------------------------------------------------------------------ epoch check


def flops_per_image(network: nn.Module, objective: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Forward + backward FLOPs of one training step per image (torch.utils.flop_counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        objective(network(images), labels).mean().backward()
    network.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(images)


def bf16_peak(device: torch.device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--peak-tflops"
    if device.type != "cuda":
        return None, "no GPU"
    name = torch.cuda.get_device_name(device)
    for key in sorted(BF16_PEAK_TFLOPS, key=len, reverse=True):
        if key in name:
            return BF16_PEAK_TFLOPS[key], f"{name} (data sheet, dense bf16)"
    return None, f"{name}: unknown, pass --peak-tflops"


def epoch_check(args: argparse.Namespace) -> dict:
    """One training epoch of the real loop (engine.train_one_epoch) on CelebA-sized synthetic tensors."""
    accelerator = create_accelerator(None, args.precision)
    device = accelerator.device
    spec = binary_spec(NUM_TASKS, pad_crop=0, hflip=True)  # CelebA's augmentation
    method_cfg = method_config("cog_fc")
    torch.manual_seed(0)
    network = apply_speed_options(build_network(model_config(args), method_cfg, spec.layout), train_config(args))
    start = time.perf_counter()
    split = random_split(args.num_images, args.image_size, NUM_TASKS, seed=0, device=device)
    split = place_split(split, device)  # train.images_on_device: uint8 images stay on the GPU
    data_seconds = time.perf_counter() - start
    objective = build_objective(spec.layout, method_cfg).to(device)
    transform = BatchTransform(spec, train=True, device=device)
    idx = torch.arange(min(args.batch_size, args.num_images))
    with accelerator.autocast():
        flops = flops_per_image(network.to(device), objective, transform(split.images[idx]), split.labels[idx])
    optimizer = build_optimizer(network, method_cfg.leader, OptimConfig())
    network, optimizer = accelerator.prepare(network, optimizer)

    def run_epoch(data: SplitData, epoch: int) -> float:
        sync(device)
        begin = time.perf_counter()
        train_one_epoch(accelerator, network, objective, optimizer, data, transform, args.batch_size, 0, epoch)
        sync(device)
        return time.perf_counter() - begin

    warmup = run_epoch(split.head(min(args.num_images, args.batch_size * args.warmup_steps)), 0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = run_epoch(split, 1)
    rate = args.num_images / seconds
    achieved = flops * rate / 1e12
    peak, peak_source = bf16_peak(device, args.peak_tflops)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "backbone": args.backbone, "cifar_stem": args.cifar_stem, "image_size": args.image_size,
        "images": args.num_images, "batch_size": args.batch_size, "precision": args.precision,
        "channels_last": args.channels_last, "compile": args.compile, "method": "cog_fc", "tasks": NUM_TASKS,
        "epoch_seconds": seconds, "images_per_s": rate, "warmup_seconds": warmup, "data_seconds": data_seconds,
        "train_flops_per_image": flops, "achieved_tflops": achieved,
        "bf16_peak_tflops": peak, "peak_source": peak_source,
        "fraction_of_peak": achieved / peak if peak else None,
        "gpu_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_rss_bytes": peak_rss_bytes(),
    }


# --------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs (seconds)")
    parser.add_argument("--epoch-check", action="store_true", help="only the one-epoch throughput check")
    parser.add_argument("--backbone", default=None, help="timm model (default cog_cnn_small; resnet101 for "
                        "--epoch-check)")
    parser.add_argument("--cifar-stem", action="store_true", help="3x3 stride-1 ResNet stem (32x32 images)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per method")
    parser.add_argument("--profile", type=int, default=0, help="profile this many COG-TS steps (torch.profiler)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--throughput-backbones", default=None, help="comma-separated extra backbones for images/s")
    parser.add_argument("--jpeg-images", type=int, default=None, help="size of the CelebA-format JPEG folder")
    parser.add_argument("--cache-images", type=int, default=None, help="images in the cache-memory check")
    parser.add_argument("--num-images", type=int, default=sum(CELEBA_SPLITS.values()), help="--epoch-check size")
    parser.add_argument("--warmup-steps", type=int, default=10, help="--epoch-check: untimed steps first")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's bf16 peak, if not in the table")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: steps,loader,calibrated,"
                        "eval,memory,throughput")
    parser.add_argument("--memory-probe", choices=["build", "model", "cache"], help=argparse.SUPPRESS)
    parser.add_argument("--probe-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _fill_defaults(args)
    return args


def _fill_defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    if args.epoch_check:
        args.backbone = args.backbone or "resnet101"
        args.batch_size = args.batch_size or 256
        return
    args.backbone = args.backbone or "cog_cnn_small"
    args.batch_size = args.batch_size or (8 if quick else 128)
    args.steps = args.steps or (2 if quick else 40)
    args.warmup = 1 if quick else 5
    args.jpeg_images = args.jpeg_images or (20 if quick else 2000)
    args.loader_epochs = 1 if quick else 2
    args.loader_seconds = 0.1 if quick else 3.0
    args.cal_train, args.cal_val, args.cal_epochs = (16, 16, 1) if quick else (2048, 1024, 2)
    args.eval_samples = 500 if quick else 20_000
    args.cache_images = args.cache_images or (300 if quick else sum(CELEBA_SPLITS.values()))
    scale = args.cache_images / sum(CELEBA_SPLITS.values())
    sizes = {k: max(1, round(v * scale)) for k, v in CELEBA_SPLITS.items()}
    sizes["train"] += args.cache_images - sum(sizes.values())
    args.cache_sizes = sizes
    if args.throughput_backbones is None:
        args.throughput_backbones = "cog_cnn_tiny" if quick else "resnet18"


def run_benchmark(args: argparse.Namespace) -> dict:
    skip = {s for s in args.skip.split(",") if s}
    load = os.getloadavg()
    result: dict = {"quick": args.quick, "device": "cuda" if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "loadavg_start": load}
    with tempfile.TemporaryDirectory(prefix="mtl_cog_bench_") as tmp:
        work = Path(tmp)
        sections = {
            "steps": lambda: measure_step_ratios(args),
            "throughput": lambda: {"throughput": [measure_throughput(b, args, 1 if args.quick else 3)
                                                  for b in args.throughput_backbones.split(",") if b]},
            "loader": lambda: measure_loader(args, work),
            "calibrated": lambda: measure_calibrated_time(args),
            "eval": lambda: measure_eval(args),
            "memory": lambda: {"cache_memory": measure_cache_memory(args, work)},
        }
        for name, section in sections.items():
            if name in skip:
                continue
            start = time.perf_counter()
            print(f"[benchmark] {name} ...", file=sys.stderr, flush=True)
            result.update(section())
            result.setdefault("section_seconds", {})[name] = time.perf_counter() - start
    result["peak_rss_bytes"] = peak_rss_bytes()
    if torch.cuda.is_available():
        result["gpu_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
    result["loadavg_end"] = os.getloadavg()
    return result


TARGETS = {"cog_fc_step_ratio": ("<=", 1.03), "cog_ts_step_ratio": ("<=", 1.03), "loader_speedup": (">=", 30.0)}


def format_table(result: dict) -> str:
    rows = []
    for key, (op, target) in TARGETS.items():
        if key in result:
            met = result[key] <= target if op == "<=" else result[key] >= target
            rows.append(f"{key:32s} {result[key]:10.3f}   target {op} {target:<6} {'met' if met else 'MISSED'}")
    for key in ("calibrated_model_time_ratio", "eval_seconds", "cache_build_seconds"):
        if key in result:
            rows.append(f"{key:32s} {result[key]:10.3f}")
    if isinstance(result.get("images_per_s"), dict):
        ips = result["images_per_s"]
        rows.append(f"{'images_per_s':32s} {ips['value']:10.1f}   {ips['backbone']} @{ips['image_size']}px "
                    f"batch {ips['batch_size']} on {ips['device']}")
    for item in result.get("throughput", []):
        rows.append(f"{'images_per_s':32s} {item['value']:10.1f}   {item['backbone']} @{item['image_size']}px")
    if "cache_memory" in result:
        cm = result["cache_memory"]
        rows.append(f"{'cache_extra_rss_MiB':32s} {cm['cache_extra_rss_bytes'] / 2**20:10.1f}   "
                    f"{cm['images']} images ({cm['image_bytes'] / 2**20:.0f} MiB), target <= 1024 "
                    f"{'met' if cm['within_1GiB'] else 'MISSED'}")
    if "epoch_seconds" in result:
        frac = result["fraction_of_peak"]
        rows.append(f"{result['backbone']} @{result['image_size']}px, {result['images']} images on {result['device']}: "
                    f"epoch {result['epoch_seconds']:.1f} s, {result['images_per_s']:.0f} images/s, "
                    f"{result['achieved_tflops']:.2f} TFLOP/s"
                    + (f" = {frac:.1%} of {result['bf16_peak_tflops']} (bf16 peak)" if frac else ""))
    rows.append(f"{'peak_rss_MiB':32s} {result['peak_rss_bytes'] / 2**20:10.1f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, args.probe_dir, args)))
        return {}
    result = epoch_check(args) if args.epoch_check else run_benchmark(args)
    print(format_table(result))
    if args.out:
        atomic_write_json(args.out, result)
        print(f"wrote {args.out}")
    return result


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
