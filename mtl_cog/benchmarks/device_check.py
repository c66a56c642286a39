"""The device check: what a short accelerator loan measures, in one call that fits 8 minutes, written to one JSON.

    bash scripts/gpu_check.sh results/benchmarks/device_check_<gpu>.json   # CUDA: the full check
    bash scripts/gpu_check.sh --tiny OUT.json     # any machine: every case at tiny sizes, one step each (a test)

Every case trains COG-FC on 40 binary tasks at 32 px through the library's loop (``device_cases``) with
the paper's settings: batch 256, bf16 autocast, channels_last, the uint8 images on the device
(``train.images_on_device``), no ``torch.compile``. Stages, each its own process or processes (a crash
loses one stage, never the JSON; it is rewritten after every stage):

1. single runs, one process, in order: ResNet-18, ResNet-50 and ResNet-101 (images/s, share of the bf16
   peak, peak memory); then options tried on ResNet-101 against that baseline, each side by side with
   it: images on the host (copied each step), batch 512 (the rates would have to be scaled: an option,
   not the paper's setting); the exact aggregator's step ratio at 40 tasks (``baseline+upgrad:parameters``
   on ResNet-18, the vmapped per-task gradients); last ``train.compile`` on ResNet-101 (dynamo's state
   stays in the process, so nothing is measured after it);
2. K = 2, 4 and 8 ResNet-18 runs side by side, each its own process on the one device, measuring the same
   window after a barrier (K = 1 is stage 1's ResNet-18): the aggregate images/s that
   ``--runs-per-device K`` would get;
3. K = 4 ResNet-101 runs side by side: the rate the paper-scale price needs at K = 4.

The time budget (stated, not measured: the next loan's JSON records ``case_seconds`` and ``stage_seconds``
to correct it). Per process ~15 s to start (python, torch, timm, the CUDA context, the model, data); per
case ~5 s of warm-up (10 steps, cuDNN's algorithm search) and the timed window W = 15 s; compiling
ResNet-101 ~60 s (ResNet-18 took 17.9 s on the H200); K processes starting at once on the loan's 16 cores
~15 + 2.5 K s:

    stage 1: 15 + 6 x (5 + 15) + (60 + 15)                  = 210 s
    stage 2: (20 + 20) + (25 + 20) + (35 + 20)              = 140 s
    stage 3: (25 + 20)                                      =  45 s
    total                                                   = 395 s  (+ ~5 s for the driver)

which leaves ~80 s of the 480 s limit (``scripts/gpu_check.sh``) for the unexpected. A stage whose
planned time is more than what remains of ``--budget-seconds`` (450) is skipped and recorded as such; a
stage still running at the budget's end is stopped and its finished cases kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mtl_cog.benchmarks.common import Workload
from mtl_cog.benchmarks.device_cases import Case
from mtl_cog.benchmarks.epoch_check import BF16_PEAK_TFLOPS
from mtl_cog.errors import ConfigError, run_cli
from mtl_cog.io import atomic_write_json

FORMAT = "mtl-cog-device-check/1"
PROCESS_START, WARMUP, COMPILE = 15.0, 5.0, 60.0  # seconds, as planned in the module docstring
BACKBONES = ("resnet18", "resnet50", "resnet101")
SIDE_BY_SIDE = (2, 4, 8)  # ResNet-18 runs per device; 1 is the single run
TARGETS = {  # the speed targets set for the paper's scale, judged only on a device (never on --tiny)
    "resnet18_k4_over_k1": (">=", 3.0), "resnet101_fraction_of_peak": (">=", 0.15),
    "upgrad_parameters_step_ratio": ("<=", 3.0)}


@dataclass(frozen=True)
class Sizes:
    image_size: int = 32
    batch_size: int = 256
    window: float = 15.0
    min_steps: int = 5
    steps_per_pass: int = 8
    warmup_steps: int = 10
    ratio_steps: int = 20
    side_by_side: tuple[int, ...] = SIDE_BY_SIDE
    big_k: int = 4  # ResNet-101 runs side by side in stage 3 (0: no stage 3)
    compile: bool = True
    precision: str = "bf16"


# --tiny: the same cases, one step each at 8 px, in fp32 (bf16 is emulated, 8-11x slower, on a CPU without
# AVX-512 BF16); K = 2 ResNet-18 runs stand for every side-by-side stage (stage 3 is the same code with
# another backbone); compile, tested apart in tests/test_epoch_check_compile.py, would cost a CPU a minute
# of C++ compilation
TINY = Sizes(image_size=8, batch_size=4, window=0.0, min_steps=1, steps_per_pass=1, warmup_steps=1, ratio_steps=1,
             side_by_side=(2,), big_k=0, compile=False, precision="no")


@dataclass(frozen=True)
class Stage:
    name: str
    cases: list[Case]
    runs: int  # processes side by side, each measuring every case
    planned_seconds: float


def stages(sizes: Sizes) -> list[Stage]:
    """The three stages of the module docstring, with their planned seconds."""
    base = Workload(backbone="resnet18", cifar_stem=True, image_size=sizes.image_size, batch_size=sizes.batch_size,
                    precision=sizes.precision, channels_last=True)
    window = {"seconds": sizes.window, "min_steps": sizes.min_steps, "steps_per_pass": sizes.steps_per_pass,
              "warmup_steps": sizes.warmup_steps}

    def run(backbone: str, runs: int = 1, name: str = "", baseline: bool = True, **workload) -> Case:
        return Case(name or f"{backbone}_k{runs}", "throughput", replace(base, backbone=backbone, **workload), runs,
                    baseline=baseline, **window)

    single = [run(b) for b in BACKBONES]
    single += [replace(run("resnet101", name="resnet101_images_on_host", baseline=False), images_on_device=False),
               run("resnet101", name="resnet101_batch512", baseline=False, batch_size=2 * sizes.batch_size),
               Case("upgrad_parameters_step_ratio", "step_ratio", base, method="baseline+upgrad:parameters",
                    warmup_steps=max(1, sizes.warmup_steps // 3), steps=sizes.ratio_steps)]
    if sizes.compile:
        single.append(run("resnet101", name="resnet101_compile", baseline=False, compile=True))
    per_case = WARMUP + sizes.window
    out = [Stage("single runs", single, 1, PROCESS_START + 6 * per_case + sizes.compile * (COMPILE + sizes.window))]
    out += [Stage(f"{k} ResNet-18 runs side by side", [run("resnet18", k)], k, PROCESS_START + 2.5 * k + per_case)
            for k in sizes.side_by_side]
    if sizes.big_k:
        out.append(Stage(f"{sizes.big_k} ResNet-101 runs side by side", [run("resnet101", sizes.big_k)], sizes.big_k,
                         PROCESS_START + 2.5 * sizes.big_k + per_case))
    return out


def run_stage(stage: Stage, work: Path, seconds_left: float, peak_tflops: float | None) -> tuple[list[dict], str]:
    """Start the stage's processes, wait (at most ``seconds_left``); -> the JSON lines they wrote, and a note."""
    folder = Path(tempfile.mkdtemp(prefix="stage_", dir=work))
    cases = folder / "cases.json"
    cases.write_text(json.dumps([c.to_json() for c in stage.cases]))
    extra = ["--peak-tflops", str(peak_tflops)] if peak_tflops else []
    processes = [subprocess.Popen([sys.executable, "-m", "mtl_cog.benchmarks.device_cases", str(cases),
                                   str(folder / f"rank{r}.jsonl"), str(folder / "barrier"), str(r), *extra])
                 for r in range(stage.runs)]
    deadline = time.monotonic() + seconds_left
    note = ""
    for process in processes:
        try:
            process.wait(timeout=None if math.isinf(deadline) else max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()  # our own child, past the loan's budget: its finished cases are kept
            process.wait()
            note = "stopped at the budget's end"
        if process.returncode and not note:
            note = f"a process ended with exit code {process.returncode} (see the output above)"
    lines = [json.loads(line) for r in range(stage.runs) if (folder / f"rank{r}.jsonl").is_file()
             for line in (folder / f"rank{r}.jsonl").read_text().splitlines() if line.strip()]
    return lines, note


def merge(case: Case, lines: list[dict], peak_known: bool) -> dict:
    """One case's record from the lines of its processes: K runs add their images/s (the device's aggregate)."""
    mine = [line for line in lines if line["case"] == case.name]
    record = {"name": case.name, "kind": case.kind, **case.workload.describe(), "runs_per_device": case.runs,
              "images_on_device": case.images_on_device, "baseline": case.baseline,
              "case_seconds": max((line["case_seconds"] for line in mine), default=None)}
    errors = [line["error"] for line in mine if "error" in line]
    if len(mine) < case.runs or errors:
        return {**record, "error": "; ".join(errors) or f"{case.runs - len(mine)} of {case.runs} process(es) wrote "
                "no result"}
    memory = {key: max((line[key] or 0 for line in mine), default=0) or None
              for key in ("gpu_max_memory_allocated_bytes", "gpu_max_memory_reserved_bytes")}
    if case.kind == "step_ratio":
        return {**record, "method": case.method, "ratio": mine[0]["ratio"], **memory,
                "median_step_seconds": mine[0]["median_step_seconds"],
                "per_task_gradients": mine[0]["per_task_gradients"]}
    achieved = sum(line["achieved_tflops"] for line in mine)
    fraction = [line["fraction_of_peak"] for line in mine]
    return {**record, "images_per_s": sum(line["images_per_s"] for line in mine),
            "per_run_images_per_s": [line["images_per_s"] for line in mine],
            "train_flops_per_image": mine[0]["train_flops_per_image"], "achieved_tflops": achieved,
            "fraction_of_peak": sum(fraction) if peak_known and None not in fraction else None,
            "steps": [line["steps"] for line in mine], "window_seconds": [line["window_seconds"] for line in mine],
            "warmup_seconds": max(line["warmup_seconds"] for line in mine),
            "barrier_wait_seconds": max(line["barrier_wait_seconds"] for line in mine), **memory,
            **({"device_name": mine[0]["device"]} if mine[0].get("device") else {})}


def judged_targets(cases: list[dict], tiny: bool) -> dict:
    """The speed targets from the measured cases: the value, the target, and met (None on --tiny or unmeasured)."""
    by_name = {c["name"]: c for c in cases if "error" not in c}
    k1, k4 = by_name.get("resnet18_k1"), by_name.get("resnet18_k4")
    values = {"resnet18_k4_over_k1": k4["images_per_s"] / k1["images_per_s"] if k1 and k4 else None,
              "resnet101_fraction_of_peak": (by_name.get("resnet101_k1") or {}).get("fraction_of_peak"),
              "upgrad_parameters_step_ratio": (by_name.get("upgrad_parameters_step_ratio") or {}).get("ratio")}
    out = {}
    for key, (sense, target) in TARGETS.items():
        value = values[key]
        met = None if tiny or value is None else (value >= target if sense == ">=" else value <= target)
        out[key] = {"value": value, "target": f"{sense} {target:g}", "met": met}
    return out


def run_check(sizes: Sizes, out: Path, budget: float, peak_tflops: float | None, tiny: bool) -> dict:
    """Every stage in turn within ``budget`` seconds; the JSON is written after each."""
    start = time.monotonic()
    planned = stages(sizes)
    result = {"format": FORMAT, "tiny": tiny, "measured_at": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "device": device_name(), "budget_seconds": None if math.isinf(budget) else budget,
        "planned_seconds": {s.name: s.planned_seconds for s in planned}, "stage_seconds": {}, "skipped": {},
        "settings": {"image_size": sizes.image_size, "batch_size": sizes.batch_size, "window_seconds": sizes.window,
                     "min_steps": sizes.min_steps, "precision": sizes.precision, "channels_last": True, "tasks": 40,
                     "method": "cog_fc"}, "cases": []}
    peak = peak_tflops or next((BF16_PEAK_TFLOPS[k] for k in sorted(BF16_PEAK_TFLOPS, key=len, reverse=True)
                                if k in result["device"]), None)
    result["bf16_peak_tflops"] = peak
    with tempfile.TemporaryDirectory(prefix="mtl_cog_device_check_") as work:
        for stage in planned:
            left = budget - (time.monotonic() - start)
            if stage.planned_seconds > left:
                result["skipped"][stage.name] = f"planned {stage.planned_seconds:.0f} s, {left:.0f} s of budget left"
                continue
            print(f"[device check] {stage.name} (planned {stage.planned_seconds:.0f} s, {left:.0f} s left)",
                  file=sys.stderr, flush=True)
            began = time.monotonic()
            lines, note = run_stage(stage, Path(work), left, peak)
            result["stage_seconds"][stage.name] = time.monotonic() - began
            if note:
                result["skipped"][stage.name] = note
            result["cases"] += [merge(case, lines, peak is not None) for case in stage.cases]
            result["peak_device_memory_bytes"] = max(
                (c.get("gpu_max_memory_reserved_bytes") or 0 for c in result["cases"]), default=0) or None
            result["targets"] = judged_targets(result["cases"], tiny)
            atomic_write_json(out, result)
    result["total_seconds"] = time.monotonic() - start
    atomic_write_json(out, result)
    return result


def device_name() -> str:
    """The GPU's name from nvidia-smi (the driver opens no CUDA context of its own), else "cpu"."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "cpu"


def format_table(result: dict) -> str:
    rows = []
    for case in result["cases"]:
        if "error" in case:
            rows.append(f"{case['name']:32s} ERROR {case['error']}")
        elif case["kind"] == "step_ratio":
            rows.append(f"{case['name']:32s} {case['ratio']:8.2f}x  ({case['per_task_gradients']})")
        else:
            frac = case["fraction_of_peak"]
            memory = case["gpu_max_memory_reserved_bytes"]
            rows.append(f"{case['name']:32s} {case['images_per_s']:10.0f} images/s"
                        + (f"  {frac:6.1%} of bf16 peak" if frac is not None else "")
                        + (f"  {memory / 2**30:5.1f} GiB reserved per run" if memory else ""))
    for key, target in result.get("targets", {}).items():
        value = target["value"]
        rows.append(f"target {key:25s} {'-' if value is None else f'{value:.3f}'} ({target['target']}): "
                    + {True: "met", False: "MISSED", None: "not judged"}[target["met"]])
    rows += [f"skipped {name}: {why}" for name, why in result["skipped"].items()]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--tiny", action="store_true", help="every case at 8 px, one step each (any machine)")
    parser.add_argument("--window", type=float, default=None, help="seconds each throughput case is timed (15)")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="stages that would not fit are skipped (default 450; none with --tiny: a test has time)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's dense bf16 peak, if not known")
    args = parser.parse_args(argv)
    folder = args.out.resolve().parent
    if args.out.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"--out {args.out}: name a JSON file in a folder that exists and is writable.")
    sizes = TINY if args.tiny else Sizes()
    if args.window is not None:
        sizes = replace(sizes, window=args.window)
    budget = args.budget_seconds or (float("inf") if args.tiny else 450.0)
    result = run_check(sizes, args.out, budget, args.peak_tflops, args.tiny)
    print(format_table(result))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    run_cli(main)
