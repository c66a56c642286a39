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
   then, for a backbone that file does not cover, the latest device benchmark committed in
   ``results/benchmarks/`` (``committed_rates``: the device check's cases run with the paper's settings,
   one-run gpu_check / epoch_check files, never a ``torch.compile`` one), for the K of
   ``--runs-per-device`` (``MeasuredRates``). With K runs sharing a device a run's estimate is its share
   of the device's time (its wall time / K, at the K runs' aggregate rate); K never measured for the
   backbone is priced at one run per device, and the source says so;
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

import datetime
import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mtl_cog.config import Config
from mtl_cog.data.task_api import TASKS, trained_sizes
from mtl_cog.errors import UserError
from mtl_cog.training.accelerator import cpu_has_native_bf16

EVAL_SPEEDUP = 3.0
BENCHMARKS = Path("results") / "benchmarks"  # committed device measurements, read by every dry run
DEVICE_CHECK_FORMAT = "mtl-cog-device-check/1"  # scripts/gpu_check.sh's JSON (mtl_cog/benchmarks/device_check.py)
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
    runs_per_device: int = 1  # K runs side by side: images_per_s is their sum, the device's aggregate


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
    k = data.get("runs_per_device", 1)
    return Throughput(float(rate), backbone, size, f"measured in {path}" + (f" ({where})" if where else ""), precision,
                      k if isinstance(k, int) and k >= 1 else 1)


def read_device_check(path: Path, name: str | None = None) -> list[Throughput]:
    """The priced rates of a ``scripts/gpu_check.sh`` JSON (``mtl_cog.benchmarks.device_check``): one per case run
    with the paper's settings (``baseline``), K runs side by side included; [] for another format. A file in this
    format whose shape is damaged (``cases`` not a list, a case lacking a key, a number written as text, an image
    size of 0) is refused in one line naming the file: a dry run would otherwise price runs from it, or stop."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != DEVICE_CHECK_FORMAT or data.get("tiny"):
        return []
    cases = data.get("cases", [])
    if not isinstance(cases, list):
        raise _damaged(path, f"'cases' is {type(cases).__name__}, not a list")
    found = []
    for number, case in enumerate(cases):
        if not isinstance(case, dict):
            raise _damaged(path, f"case {number} is {type(case).__name__}, not a mapping")
        if case.get("kind") != "throughput" or not case.get("baseline") or "error" in case:
            continue
        problem = _case_problem(case)
        if problem:
            raise _damaged(path, f"case {number} ({case.get('name', '?')}): {problem}")
        rate, k = float(case["images_per_s"]), case.get("runs_per_device", 1)
        found.append(Throughput(rate, case["backbone"], case["image_size"],
                                f"measured in {name or path} ({data.get('device', '?')}, {case['precision']}, "
                                f"{k} run{'s' if k > 1 else ''} per device)",
                                case["precision"] if case["precision"] in PRECISION_SPEED else "bf16", k))
    return found


def _number(value, whole: bool = False) -> bool:
    """A JSON number (not a bool, not text), finite and positive; ``whole``: an integer."""
    return (isinstance(value, int) if whole else isinstance(value, (int, float))) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def _case_problem(case: dict) -> str:
    """What makes a priced case of a device check unusable, "" when nothing."""
    for key, whole in (("images_per_s", False), ("image_size", True), ("runs_per_device", True)):
        if key not in case and key != "runs_per_device":
            return f"no {key}"
        if key in case and not _number(case[key], whole):
            return f"{key} is {case[key]!r}, not a positive {'whole ' if whole else ''}number"
    for key in ("backbone", "precision"):
        if not isinstance(case.get(key), str) or not case[key]:
            return f"{key} is {case.get(key)!r}, not a name"
    return ""


def _damaged(path: Path, problem: str) -> UserError:
    return UserError(f"{path}: a damaged device check ({problem}). Restore it from git, or measure anew: bash "
                     "scripts/gpu_check.sh")


def committed_rates(clone: Path) -> list[tuple[float, Throughput]]:
    """Every device rate committed in ``<clone>/results/benchmarks/`` with the time it was measured (its
    ``measured_at``, else the file's last commit, else 0): device-check cases and one-run gpu_check files,
    ``torch.compile`` measurements left out (no shipped config compiles)."""
    out = []
    for path in sorted((clone / BENCHMARKS).glob("*.json")):
        name = str(path.relative_to(clone))
        when = _measured_at(path)
        rates = read_device_check(path, name)
        if not rates:
            try:
                compiled = json.loads(path.read_text()).get("compile") is True
            except (OSError, ValueError, AttributeError):
                continue
            single = None if compiled else read_gpu_check(path)
            rates = [] if single is None or "cpu" in single.source else [
                Throughput(single.images_per_s, single.backbone, single.image_size,
                           single.source.replace(str(path), name), single.precision, single.runs_per_device)]
        out += [(when, rate) for rate in rates]
    return out


def _measured_at(path: Path) -> float:
    try:
        stamp = json.loads(path.read_text()).get("measured_at")
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    try:
        done = subprocess.run(["git", "-C", str(path.parent), "log", "-1", "--format=%ct", "--", path.name],
                              capture_output=True, text=True, timeout=10)
        return float(done.stdout.strip() or 0)
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0.0


@dataclass(frozen=True)
class MeasuredRates:
    """The measured rates a dry run may use: a named or local gpu_check.json first, then the latest committed
    device benchmark for the run's backbone at ``runs_per_device`` (K; at K = 1 when K was not measured, said)."""

    runs_per_device: int = 1
    explicit: tuple[Throughput, ...] = ()  # --gpu-check's file, or ./gpu_check.json
    committed: tuple[tuple[float, Throughput], ...] = ()

    def for_backbone(self, backbone: str) -> tuple[Throughput | None, str]:
        """(the rate, a note when K runs side by side were asked for and not measured)."""
        def latest(k: int) -> Throughput | None:
            for rate in self.explicit:
                if rate.backbone == backbone and rate.runs_per_device == k:
                    return rate
            mine = [(when, rate) for when, rate in self.committed if rate.backbone == backbone
                    and rate.runs_per_device == k]
            return max(mine, key=lambda item: (item[0], item[1].source))[1] if mine else None

        k = self.runs_per_device
        if (found := latest(k)) is not None or k == 1:
            return found, ""
        single = latest(1)
        return single, "" if single is None else (
            f"; no measurement of {k} {backbone} runs side by side in {BENCHMARKS}: priced at one run per device, "
            f"the device time {k} runs per device would save is unknown (measure it: bash scripts/gpu_check.sh)")


def find_gpu_check(given: Path | None, clone: Path, runs_per_device: int = 1) -> MeasuredRates | None:
    """``given`` (must be readable), else ./gpu_check.json, else <clone>/gpu_check.json; with the latest device
    benchmarks committed in <clone>/results/benchmarks/ for the backbones that file does not cover."""
    explicit: list[Throughput] = []
    if given is not None:
        explicit = read_device_check(given) or [r for r in [read_gpu_check(given)] if r is not None]
        if not explicit:
            raise UserError(f"--gpu-check {given}: no usable images_per_s/backbone/image_size in it "
                            "(write it with bash scripts/gpu_check.sh).")
    for candidate in (Path("gpu_check.json"), clone / "gpu_check.json"):
        if not explicit and candidate.is_file():
            explicit = read_device_check(candidate) or [r for r in [read_gpu_check(candidate)] if r is not None]
    committed = tuple(committed_rates(clone))
    if not explicit and not committed:
        return None
    return MeasuredRates(runs_per_device, tuple(explicit), committed)


def rate_for(measured: Throughput | MeasuredRates | None, backbone: str) -> tuple[Throughput | None, str]:
    """The measured rate that applies to ``backbone`` (and the note on it), from either kind of ``measured``."""
    if isinstance(measured, MeasuredRates):
        return measured.for_backbone(backbone)
    return (measured, "") if measured is not None and measured.backbone == backbone else (None, "")


def training_rate(cfg: Config, measured: Throughput | None) -> tuple[float, str, bool]:
    """-> (training images/s for this run, where that number comes from, whether it is a CPU rate)."""
    size, backbone = cfg.data.image_size, cfg.model.backbone
    speed = PRECISION_SPEED.get(cfg.train.precision, 1.0)
    found, note = rate_for(measured, backbone)
    if found is not None:
        per_run = found.images_per_s / found.runs_per_device  # K runs side by side share the aggregate rate
        rate = per_run * (found.image_size / size) ** 2 * speed / PRECISION_SPEED[found.precision]
        scaled = "" if found.image_size == size else f", scaled from {found.image_size} px by pixel count"
        if cfg.train.precision != found.precision:
            scaled += f", x{speed / PRECISION_SPEED[found.precision]:g} for precision {cfg.train.precision} (assumed)"
        if found.runs_per_device > 1:
            scaled += (f"; the device time of one of {found.runs_per_device} runs sharing a device (each run's wall "
                       f"time is {found.runs_per_device}x it)")
        return rate, f"{found.source}{scaled}{note}", False
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
    found, _ = (None, "") if on_cpu else rate_for(measured, cfg.model.backbone)
    share = found.runs_per_device if found is not None else 1  # K runs share a device: each costs 1/K of its time
    task = TASKS.get(cfg.data.task) if cfg.data.task in TASKS else None
    sizes_of = getattr(task, "split_sizes", None)
    sizes = trained_sizes(sizes_of(cfg.data), cfg.data.train_size, cfg.data.task) if sizes_of is not None else None
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
    return RunEstimate(seconds / share, sizes, source, on_cpu)


def format_duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
