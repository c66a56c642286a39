"""One case of the device check, measured inside one process: a time-boxed training window, or a step ratio.

A *throughput* case trains COG-FC with 40 binary tasks through the library's loop
(``train_one_epoch``, what ``fit`` runs) over passes of ``steps_per_pass`` batches of random uint8
images, kept on the device as with ``train.images_on_device=true`` (or on the host, copied each step,
as without it), for at least ``min_steps`` steps and ``seconds`` of wall time after an untimed warm-up
pass. Several processes of one case (K runs side by side on one device) meet at a file barrier after
their warm-ups, so that their windows overlap. The training FLOPs per image (``epoch_check``'s count)
times images/s give the achieved TFLOP/s and the share of the card's bf16 peak; the device's peak
allocated and reserved memory are read after the window.

A *step_ratio* case is ``step_ratio.measure_step_ratios`` of one method over the baseline (the exact
aggregator on the backbone's parameters, ``baseline+upgrad:parameters``), which also says whether the
per-task gradients took the vmapped path.

``device_check.py`` (the driver) starts the processes and writes the JSON; this module is what runs in
them (``python -m mtl_cog.benchmarks.device_cases CASES.json RESULTS.jsonl``).
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate.state import AcceleratorState

from mtl_cog.benchmarks.common import NUM_TASKS, Workload, binary_spec, method_config, random_split, sync
from mtl_cog.benchmarks.epoch_check import METHOD, bf16_peak, flops_per_image
from mtl_cog.benchmarks.step_ratio import measure_step_ratios
from mtl_cog.data.batches import BatchTransform, place_split
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.step import train_one_epoch
from mtl_cog.training.trainee import build_trainee

METHODS_DIR = Path(__file__).resolve().parents[2] / "configs" / "methods"
BARRIER_TIMEOUT = 180.0  # seconds a process waits for the others of its case before measuring alone


@dataclass(frozen=True)
class Case:
    """What one case measures. ``runs`` > 1: that many processes of it side by side on one device."""

    name: str
    kind: str  # throughput | step_ratio
    workload: Workload
    runs: int = 1
    images_on_device: bool = True
    baseline: bool = True  # the paper's settings (what a price is read from), not an option tried against them
    method: str = ""  # step_ratio: the method timed over the baseline
    seconds: float = 15.0  # throughput: the timed window
    min_steps: int = 1
    steps_per_pass: int = 8
    warmup_steps: int = 10  # throughput: untimed steps first; step_ratio: untimed rounds
    steps: int = 20  # step_ratio: timed rounds

    def to_json(self) -> dict:
        return {**asdict(self), "workload": self.workload.describe()}

    @staticmethod
    def from_json(data: dict) -> Case:
        return Case(**{**data, "workload": Workload(**data["workload"])})


def wait_for_others(barrier: Path | None, rank: int, runs: int) -> float:
    """Mark this process ready and wait until all ``runs`` are (seconds waited); alone: no wait."""
    if barrier is None or runs == 1:
        return 0.0
    barrier.mkdir(parents=True, exist_ok=True)
    (barrier / f"ready{rank}").touch()
    start = time.monotonic()
    while len(list(barrier.glob("ready*"))) < runs and time.monotonic() - start < BARRIER_TIMEOUT:
        time.sleep(0.02)
    return time.monotonic() - start


def measure_window(case: Case, barrier: Path | None = None, rank: int = 0, peak_tflops: float | None = None) -> dict:
    """Images/s of one process of a throughput case (module docstring)."""
    workload = case.workload
    accelerator = create_accelerator(None, workload.precision)
    device = accelerator.device
    cfg = method_config(METHODS_DIR, METHOD, workload)
    spec = binary_spec(NUM_TASKS, pad_crop=0, hflip=True)  # CelebA's augmentation
    trainee = build_trainee(accelerator, cfg, spec.layout, seed=rank)
    batch = workload.batch_size
    split = random_split(batch * max(case.steps_per_pass, case.warmup_steps), workload.image_size, NUM_TASKS,
                         seed=rank, device=device if case.images_on_device else "cpu")
    split = place_split(split, device) if case.images_on_device else split
    transform = BatchTransform(spec, train=True, device=device)
    idx = torch.arange(batch)
    with accelerator.autocast():
        flops = flops_per_image(trainee.model, trainee.objective, transform(split.images[idx].to(device)),
                                split.labels[idx].to(device))

    def one_pass(steps: int, epoch: int) -> None:
        train_one_epoch(accelerator, trainee.network, trainee.objective, trainee.optimizer,
                        split.head(batch * steps), transform, batch, rank, epoch)

    warmup_start = time.perf_counter()
    one_pass(case.warmup_steps, 0)
    sync(device)
    warmup = time.perf_counter() - warmup_start
    waited = wait_for_others(barrier, rank, case.runs)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, epoch = 0, 1
    start = time.perf_counter()
    while steps < case.min_steps or time.perf_counter() - start < case.seconds:
        one_pass(case.steps_per_pass, epoch)
        steps, epoch = steps + case.steps_per_pass, epoch + 1
    sync(device)
    seconds = time.perf_counter() - start
    rate = steps * batch / seconds
    peak, _ = bf16_peak(device, peak_tflops)
    achieved = flops * rate / 1e12
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "images_per_s": rate, "steps": steps, "window_seconds": seconds, "warmup_seconds": warmup,
            "barrier_wait_seconds": waited, "train_flops_per_image": flops, "achieved_tflops": achieved,
            "fraction_of_peak": achieved / peak if peak else None, **device_memory(device)}


def device_memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"gpu_max_memory_allocated_bytes": None, "gpu_max_memory_reserved_bytes": None}
    return {"gpu_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "gpu_max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def measure_ratio(case: Case) -> dict:
    """The step ratio of ``case.method`` over the baseline, and which path its per-task gradients took."""
    result = measure_step_ratios(case.workload, METHODS_DIR, [case.method], case.steps, case.warmup_steps)
    device = torch.device(result["images_per_s"]["device"])
    return {"ratio": result[f"{case.method}_step_ratio"], "median_step_seconds": result["median_step_seconds"],
            "per_task_gradients": result.get("per_task_gradients", {}).get(case.method), **device_memory(device)}


def run_cases(cases: list[Case], results: Path, barrier: Path | None = None, rank: int = 0,
              peak_tflops: float | None = None) -> None:
    """Measure ``cases`` in order, appending one JSON line per case to ``results`` as each ends; a case that
    fails (out of memory, an op the device lacks) is recorded with its error and the next one runs."""
    for case in cases:
        start = time.perf_counter()
        try:
            if case.kind == "throughput":
                measured = measure_window(case, barrier, rank, peak_tflops)
            else:
                measured = measure_ratio(case)
        except Exception as err:  # noqa: BLE001  (recorded; the loan's minutes go to the other cases)
            traceback.print_exc()
            said = str(err).strip().splitlines()
            measured = {"error": f"{type(err).__name__}: {said[0] if said else ''}"}
        line = {"case": case.name, "rank": rank, "case_seconds": time.perf_counter() - start, **measured}
        with open(results, "a") as out:
            out.write(json.dumps(line) + "\n")
        release(case)


def release(case: Case) -> None:
    """Free what a case held before the next one (its memory would be counted as the next case's)."""
    AcceleratorState._reset_state(reset_partial_state=True)  # each case builds its own accelerator
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    """``CASES.json RESULTS.jsonl [BARRIER_DIR RANK] [--peak-tflops X]``: what the driver starts."""
    args = list(sys.argv[1:] if argv is None else argv)
    peak = None
    if "--peak-tflops" in args:
        at = args.index("--peak-tflops")
        peak = float(args[at + 1])
        del args[at:at + 2]
    cases = [Case.from_json(c) for c in json.loads(Path(args[0]).read_text())]
    barrier, rank = (Path(args[2]), int(args[3])) if len(args) > 3 else (None, 0)
    run_cases(cases, Path(args[1]), barrier, rank, peak)


if __name__ == "__main__":
    main()
