"""How long a run will take, before it runs: the numbers behind every ``--dry-run``.

A run's time is dominated by passes over images, so we count them and divide by a throughput:

    seconds = START + epochs * (train / rate + val / (EVAL_SPEEDUP * rate))
              + (val + test) / (EVAL_SPEEDUP * rate)                        # the final evaluation
              + two_stage.epochs * (train + val) / (EVAL_SPEEDUP * rate)    # TST / V-TST stage two, at most
              + evaluations * tasks * SCORE_SECONDS_PER_TASK                # scoring every validation, per task

``EVAL_SPEEDUP = 3``: a forward pass is about a third of a training step's FLOPs (forward +
backward ~ 3x forward), and stage two runs the frozen backbone forward only. Split sizes come
from the task's ``split_sizes`` (official sizes; nothing is read), capped by ``data.max_samples``;
the task count from its ``num_tasks``. Scoring (every metric of every task, each epoch) costs a
fixed time per task that does not shrink with the data: at CPU scale it is a third of a
40-task run; at GPU scale it is noise next to an epoch.

The throughput (training images/s of one run) comes from, in this order:

1. a ``gpu_check.json`` written by ``scripts/gpu_check.sh`` (``--gpu-check FILE``, else
   ``./gpu_check.json``, else the clone's): keys read are ``images_per_s`` (a number, or a mapping
   with ``value``), ``backbone``, ``image_size`` and, if present, ``device``/``precision``. It
   applies to runs of the same backbone; another image size is scaled by the pixel count
   (a conv net's FLOPs per image are proportional to H x W);
2. otherwise the stated defaults below: ResNet-101 training on **one H100-class GPU** (bf16
   autocast, channels_last, images on the GPU), which are estimates, not measurements; a run
   with ``train.precision=no`` (fp32, the shipped configs' setting) is assumed half as fast;
3. the CPU-scale runs of ``scripts/reproduce.py`` (tiny CNN, 16 px): a rate measured on this
   project's 2-core development machine with one torch thread per run, scaled by pixel count and, for
   the tiny CNN under ``train.precision=bf16`` / ``train.channels_last``, by their measured step
   speed-up (``CPU_SPEED_OPTIONS`` on a CPU with AVX-512 BF16 or AMX, ``CPU_SPEED_OPTIONS_NO_BF16`` on
   one without: there bf16 is emulated and 8-11x slower than fp32).

A backbone with no known rate is estimated with ResNet-101's and the note says so (an upper bound
for the small CNNs). Every estimate carries a one-line ``source`` that the dry run prints.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mtl_cog.config import Config
from mtl_cog.data.task_api import TASKS, trained_sizes
from mtl_cog.errors import UserError
from mtl_cog.training.accelerator import cpu_has_native_bf16

EVAL_SPEEDUP = 3.0
START_SECONDS = 30.0  # process start, data loading from the cache, model build (GPU runs)
# A CPU run's own process beyond the fitted start: python, torch and the package imported, and at the end the
# best checkpoint's test scoring (every metric of every task), its figures and files, which dry runs left out.
# Measured: a 5-epoch synthetic COG-TS run (`mtl-cog train ... train.epochs=5`, W&B offline, 2 cores at a load
# of about 2.5) took 55 s, its epochs 24 s of them; the dry run had said 12 s. A tiny leader curve's dry run
# said 20 s for what took 200 s. 15 s: those 31 s at that load, without W&B's start and stop (campaign runs go
# without) and the first use's cache build, on an idle core; an estimate to refit from the times the README
# tour's leader curve prints (tests/test_readme_tour.py).
CPU_PROCESS_SECONDS = 15.0
CPU_START_SECONDS = 3.5 + CPU_PROCESS_SECONDS  # tiny CPU runs: start (fitted, below) and the run's own process
# Stated defaults, one H100-class GPU, bf16 + channels_last, uint8 images on the GPU. Derived from
# public ResNet-50 training rates at 224 px (~3,000 images/s on A100 with AMP; ~1.5-2x on H100)
# and ResNet-101 ~ 1.9x ResNet-50's FLOPs; the CIFAR stem (3x3 conv, no max-pool) keeps 32x32
# feature maps where the ImageNet stem has 56x56 at 224 px, hence (32/56)^2 of the FLOPs, with a
# utilisation loss on such small maps. Replace them with a measurement: bash scripts/gpu_check.sh.
DEFAULT_GPU_RATES = {  # (image size, cifar_stem) -> training images/s of ResNet-101
    (32, True): 6000.0,
    (64, True): 1600.0,
    (224, False): 2500.0,
}
DEFAULT_GPU = "ResNet-101, one H100-class GPU (stated default, not measured)"
# Relative speed by train.precision: fp32 matmuls run as TF32 on such GPUs, about half the bf16
# rate for ResNets (assumed). Applied to the defaults, and to a measurement of another precision.
PRECISION_SPEED = {"bf16": 1.0, "fp16": 1.0, "no": 0.5}
# Measured: the 188 runs of `scripts/reproduce.py --protocol fair --budget 8` (every paper method,
# digits 50 epochs and synthetic 40, cog_cnn_tiny at 16 px, batch 64, one torch thread per run,
# --jobs 2 on the idle 2-core development machine): least squares of the run times (21-28 s) on
# start, images and task-evaluations; every (data set, method) mean within 0.9 s of the model.
# (An earlier fit to two runs on the same machine shared by ~9 jobs gave 600 images/s: dry runs
# then said 107 min for what took 45.)
CPU_TINY_RATE = 3400.0  # training images/s, cog_cnn_tiny at 16 px, one CPU core
SCORE_SECONDS_PER_TASK = 0.0057  # scoring one task's validation (every metric, every bin count); CPU
# backbone -> (the image size its rate is for, its speed relative to CPU_TINY_RATE). cog_cnn_small
# is about 4x slower per image; the LiST network's tiny backbone (spectral-norm parametrisations,
# whose power iterations run every step) 1.15x: 20-epoch digits runs side by side, baseline
# 29.2 s vs LiST 32.2 s wall, ~8 s of each fixed (start, W&B offline).
CPU_BACKBONES = {"cog_cnn_tiny": (16, 1.0), "cog_cnn_small": (32, 0.25), "cog_lipschitz_tiny": (16, 0.87)}
# image size -> {(train.precision, train.channels_last): training-step speed of cog_cnn_tiny over fp32 NCHW} on a
# CPU (applied at the nearest measured size; one 40-step median each, so about two digits). Measured by
# the benchmark's speed_options section (`scripts/benchmark.py --backbone cog_cnn_tiny --image-size 16|32
# --threads 1 --skip steps,throughput,loader,calibrated,eval,memory`, batch 128, lanes paused) on the development
# machine, an AMD EPYC with AVX-512 BF16; a CPU without bf16 instructions may be slower under bf16 than fp32.
CPU_SPEED_OPTIONS = {16: {("no", True): 1.32, ("bf16", False): 1.33, ("bf16", True): 1.70},
                     32: {("no", True): 1.44, ("bf16", False): 1.63, ("bf16", True): 2.16}}
# The same on a CPU without bf16 instructions (an AVX2-only AMD EPYC, the 2-core machine of a later session;
# results/benchmarks/speed_options_avx2_*px.json): bf16 is emulated, 8-11x slower than fp32.
CPU_SPEED_OPTIONS_NO_BF16 = {16: {("no", True): 1.36, ("bf16", False): 0.105, ("bf16", True): 0.124},
                             32: {("no", True): 1.28, ("bf16", False): 0.086, ("bf16", True): 0.109}}


@dataclass(frozen=True)
class Throughput:
    images_per_s: float
    backbone: str
    image_size: int
    source: str
    precision: str = "bf16"  # the train.precision it was measured with


@dataclass(frozen=True)
class RunEstimate:
    seconds: float
    sizes: dict[str, int] | None  # train/val/test images, when the task knows them
    source: str  # where the rate came from
    on_cpu: bool = False  # a one-core CPU rate: the seconds are core-seconds


def read_gpu_check(path: Path) -> Throughput | None:
    """The throughput in a gpu_check.json, or None if the file lacks a usable one (see the module docstring)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    rate = data.get("images_per_s")
    if isinstance(rate, dict):  # benchmark.py's full format: {"value": ..., "backbone": ...}
        data = {**data, **rate}
        rate = rate.get("value")
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return None
    backbone, size = data.get("backbone"), data.get("image_size")
    if not isinstance(backbone, str) or not isinstance(size, int) or size <= 0:
        return None
    where = ", ".join(str(data[k]) for k in ("device", "precision") if data.get(k))
    precision = data.get("precision") if data.get("precision") in PRECISION_SPEED else "bf16"
    return Throughput(float(rate), backbone, size, f"measured in {path}" + (f" ({where})" if where else ""), precision)


def find_gpu_check(given: Path | None, clone: Path) -> Throughput | None:
    """``given`` (must be readable), else ./gpu_check.json, else <clone>/gpu_check.json."""
    if given is not None:
        measured = read_gpu_check(given)
        if measured is None:
            raise UserError(f"--gpu-check {given}: no usable images_per_s/backbone/image_size in it "
                            "(write it with bash scripts/gpu_check.sh).")
        return measured
    for candidate in (Path("gpu_check.json"), clone / "gpu_check.json"):
        if candidate.is_file() and (measured := read_gpu_check(candidate)) is not None:
            return measured
    return None


def training_rate(cfg: Config, measured: Throughput | None) -> tuple[float, str, bool]:
    """-> (training images/s for this run, where that number comes from, whether it is a CPU rate)."""
    size, backbone = cfg.data.image_size, cfg.model.backbone
    speed = PRECISION_SPEED.get(cfg.train.precision, 1.0)
    if measured is not None and measured.backbone == backbone:
        rate = measured.images_per_s * (measured.image_size / size) ** 2 * speed / PRECISION_SPEED[measured.precision]
        scaled = "" if measured.image_size == size else f", scaled from {measured.image_size} px by pixel count"
        if cfg.train.precision != measured.precision:
            scaled += f", x{speed / PRECISION_SPEED[measured.precision]:g} for precision {cfg.train.precision}"
        return rate, f"{measured.source}{scaled}", False
    if backbone in CPU_BACKBONES:
        rated_size, relative_speed = CPU_BACKBONES[backbone]
        rate = CPU_TINY_RATE * relative_speed * (rated_size / size) ** 2
        source = f"{backbone}, one CPU core (measured on the 2-core development machine)"
        native_bf16 = cpu_has_native_bf16()
        table = CPU_SPEED_OPTIONS if native_bf16 else CPU_SPEED_OPTIONS_NO_BF16
        options = table[min(table, key=lambda s: abs(math.log(s / size)))]
        option_speed = options.get((cfg.train.precision, cfg.train.channels_last), 1.0)
        if option_speed != 1.0 and backbone != "cog_cnn_tiny":  # measured on the tiny CNN only
            source += (f", precision {cfg.train.precision}{' + channels_last' if cfg.train.channels_last else ''} "
                       "not counted (its speed was measured for cog_cnn_tiny only)")
        elif option_speed != 1.0:
            rate *= option_speed
            source += (f", x{option_speed:g} for precision {cfg.train.precision}"
                       f"{' + channels_last' if cfg.train.channels_last else ''} (measured on "
                       f"{'an AVX-512 BF16' if native_bf16 else 'an AVX2-only'} CPU like this one; measure yours: "
                       "scripts/benchmark.py's speed_options)")
        return rate, source, True
    key = min(DEFAULT_GPU_RATES, key=lambda k: (k[1] != cfg.model.cifar_stem, abs(math.log(k[0] / size))))
    rate = DEFAULT_GPU_RATES[key] * (key[0] / size) ** 2 * speed
    note = DEFAULT_GPU if backbone == "resnet101" else f"{DEFAULT_GPU}; no rate known for {backbone}, ResNet-101's used"
    note += f", precision {cfg.train.precision}" + (" (TF32: x0.5 of bf16, assumed)" if speed != 1.0 else "")
    if key[0] != size:
        note += f", scaled from {key[0]} px by pixel count"
    return rate, note, False


def estimate_run(cfg: Config, measured: Throughput | None = None) -> RunEstimate:
    """Estimated wall time of one run of ``cfg`` on one device (see the module docstring)."""
    rate, source, on_cpu = training_rate(cfg, measured)
    task = TASKS.get(cfg.data.task) if cfg.data.task in TASKS else None
    sizes_of = getattr(task, "split_sizes", None)
    sizes = trained_sizes(sizes_of(cfg.data), cfg.data.train_size) if sizes_of is not None else None
    if sizes is None:
        return RunEstimate(math.nan, None, source + f"; split sizes of {cfg.data.task!r} unknown", on_cpu)
    forward = EVAL_SPEEDUP * rate
    seconds = (CPU_START_SECONDS if on_cpu else START_SECONDS)
    seconds += cfg.train.epochs * (sizes["train"] / rate + sizes["val"] / forward)
    seconds += (sizes["val"] + sizes["test"]) / forward * (2 if cfg.eval.score_last_epoch else 1)
    evaluations = cfg.train.epochs + 2  # a validation per epoch, then validation and test once more
    if cfg.two_stage.enabled:
        seconds += cfg.two_stage.epochs * (sizes["train"] + sizes["val"]) / forward
        evaluations += cfg.two_stage.epochs
    num_tasks = getattr(task, "num_tasks", None)
    seconds += evaluations * (num_tasks(cfg.data) if num_tasks is not None else 1) * SCORE_SECONDS_PER_TASK
    return RunEstimate(seconds, sizes, source, on_cpu)


def format_duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
