"""Data-cache benchmark: peak memory of a streaming cache build, and the cost of verifying a cache.

    python -m mtl_cog.benchmarks.cache_build --work /tmp/cache_bench --out cache_build.json
    python -m mtl_cog.benchmarks.cache_build --work /tmp/cb --images 600 --sizes 16 --epoch-steps 3   # seconds

Both numbers are measured side by side in one run and printed as ratios/targets:

- ``build``: for every image size (``--sizes``, default 64 and 128 px) and image count
  (``--images``, default 20,000 and 202,599), a fresh child process builds the CelebA cache from
  a CelebA-format folder (official layout and text files; ``--distinct`` JPEGs are encoded, the
  other names are hard links to them, so every one of the N files is opened and decoded) and
  reports its peak RSS above the RSS it had with everything imported, just before the build
  (``VmHWM`` of the probe process: ``ru_maxrss`` would carry the parent's peak across exec).
  Target: <= 1 GiB at 202,599 images, and flat in N.
- ``verify``: a CelebA-sized cache (202,599 x 3 x 32 x 32 uint8, the official split sizes, 40
  binary labels) is written from random pixels, then ``inspect_cache`` (every file's checksum,
  label ranges, memory maps: what every ``load_task`` does) is timed with the files in the page
  cache ("warm") and after evicting them (``posix_fadvise(DONTNEED)``: "cold", read from disk).
  One CPU epoch of ``cog_cnn_small`` (COG-FC, batch 256, 32 px) is estimated by timing
  ``--epoch-steps`` real steps of ``mtl_cog.training.step.train_one_epoch`` and extrapolating to
  the 162,770 training images (the output says so). Target: verification <= 10 % of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mtl_cog.benchmarks.common import CELEBA_SPLITS, peak_rss_bytes
from mtl_cog.config import DataConfig, load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.cache import cache_dir, inspect_cache, load_cached
from mtl_cog.data.cache_writer import write_source
from mtl_cog.data.task_api import TASKS, SplitSource, TaskSource, TaskSpec, block_ranges
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.step import train_one_epoch
from mtl_cog.training.trainee import build_trainee
from tasks.fixtures import CELEBA_ATTRIBUTES, write_celeba

CELEBA_IMAGES = sum(CELEBA_SPLITS.values())  # 202,599
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB = 2**30


# ------------------------------------------------------------------------------- build memory


def celeba_folder(work: Path, n: int, distinct: int) -> Path:
    """``<work>/celeba_<n>/celeba/``: a CelebA-format folder of n images (written once, then reused)."""
    root = work / f"celeba_{n}"
    done = root / "written.json"
    if not done.exists():
        write_celeba(root, n=n, distinct_images=distinct)
        done.write_text(json.dumps({"images": n, "distinct": distinct}))
    return root


def build_probe(root: Path, size: int, cache: Path) -> dict:
    """In a fresh process: build the CelebA cache of ``root`` at ``size`` px; peak RSS above the start."""
    data_cfg = DataConfig(task="celeba", root=str(root), image_size=size, cache_dir=str(cache))
    task = TASKS.get("celeba")
    before = peak_rss_bytes()  # interpreter + torch + numpy + PIL + the project, imported
    start = time.perf_counter()
    data = load_cached(task, data_cfg, show_progress=False)
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    images = sum(len(split) for split in data.splits.values())
    folder = cache_dir(data_cfg)
    return {"image_size": size, "images": images, "rss_before_bytes": before, "peak_rss_bytes": peak,
            "peak_above_interpreter_bytes": peak - before, "build_seconds": seconds,
            "images_per_s": images / seconds, "cache_bytes": sum(p.stat().st_size for p in folder.iterdir())}


def measure_build(args: argparse.Namespace, work: Path) -> list[dict]:
    results = []
    for n in args.images:
        root = celeba_folder(work, n, args.distinct)
        for size in args.sizes:
            cache = work / f"cache_{n}_{size}"
            command = [sys.executable, "-m", "mtl_cog.benchmarks.cache_build", "--probe-build", str(root),
                       "--probe-size", str(size), "--probe-cache", str(cache)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"build probe failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["within_1GiB"] = result["peak_above_interpreter_bytes"] <= GIB
            results.append(result)
            print(f"build {n:>7} images at {size:>3} px: peak RSS +{result['peak_above_interpreter_bytes'] / 2**20:.0f}"
                  f" MiB above the interpreter, {result['build_seconds']:.0f} s", file=sys.stderr)
            if not args.keep:
                shutil.rmtree(cache, ignore_errors=True)
    return results


# ------------------------------------------------------------------------- verification cost


def random_source(split_sizes: dict[str, int], size: int, num_tasks: int) -> TaskSource:
    """A TaskSource of random pixels and binary labels, produced block by block (no whole array in RAM)."""
    spec = TaskSpec("celeba_sized", tuple(CELEBA_ATTRIBUTES[:num_tasks]), (2,) * num_tasks, (0.5,) * 3, (0.25,) * 3)

    def blocks(seed: int):
        def read_blocks(stop: int):
            rng = np.random.default_rng(seed)
            for start, end in block_ranges(stop, size):
                yield rng.integers(0, 256, size=(end - start, 3, size, size), dtype=np.uint8)
        return read_blocks

    rng = np.random.default_rng(0)
    splits = {name: SplitSource(rng.integers(0, 2, size=(n, num_tasks)), blocks(i + 1))
              for i, (name, n) in enumerate(split_sizes.items())}
    return TaskSource(spec, size, splits)


def evict(folder: Path) -> None:
    """Drop this folder's pages from the page cache (only its own files; nothing else is touched)."""
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_verification(folder: Path, repeats: int, cold: bool) -> float:
    durations = []
    for _ in range(repeats):
        if cold:
            evict(folder)
        start = time.perf_counter()
        data, problem = inspect_cache(folder, None)
        durations.append(time.perf_counter() - start)
        if data is None:
            raise RuntimeError(f"the benchmark cache does not verify: {problem}")
    return statistics.median(durations)


def epoch_estimate(args: argparse.Namespace, train_images: int) -> dict:
    """Seconds of one CPU training epoch of cog_cnn_small over ``train_images``, from timed real steps."""
    cfg = load_config(CONFIGS / "celeba" / "cog_fc.yaml", ["model.backbone=cog_cnn_small", "model.cifar_stem=false"])
    spec = TaskSpec("celeba_sized", tuple(CELEBA_ATTRIBUTES), (2,) * 40, (0.5,) * 3, (0.25,) * 3, hflip=True)
    accelerator = create_accelerator(None, "no")
    trainee = build_trainee(accelerator, cfg, spec.layout, seed=0)  # network, objective, optimiser as fit builds them
    network, objective, optimizer = trainee.network, trainee.objective, trainee.optimizer
    batch = cfg.train.batch_size
    source = random_source({"train": batch * (args.epoch_steps + 2)}, 32, 40)
    split = source.decode()
    transform = BatchTransform(spec, train=True)
    warm = split.splits["train"].head(2 * batch)  # two warm-up steps (allocator, threads)
    train_one_epoch(accelerator, network, objective, optimizer, warm, transform, batch, seed=0, epoch=0)
    timed = split.splits["train"].head(batch * args.epoch_steps)
    start = time.perf_counter()
    train_one_epoch(accelerator, network, objective, optimizer, timed, transform, batch, seed=0, epoch=1)
    seconds = time.perf_counter() - start
    steps_per_epoch = -(-train_images // batch)
    return {"backbone": cfg.model.backbone, "method": cfg.method.name, "batch_size": batch, "image_size": 32,
            "timed_steps": args.epoch_steps, "seconds_per_step": seconds / args.epoch_steps,
            "steps_per_epoch": steps_per_epoch, "epoch_seconds": seconds / args.epoch_steps * steps_per_epoch,
            "note": f"extrapolated from {args.epoch_steps} timed steps to {train_images} training images",
            "torch_threads": torch.get_num_threads()}


def measure_verify(args: argparse.Namespace, work: Path) -> dict:
    scale = args.verify_images / CELEBA_IMAGES
    sizes = {name: max(1, round(n * scale)) for name, n in CELEBA_SPLITS.items()}
    folder = work / "celeba_sized_cache"
    if not (folder / "meta.json").exists():
        start = time.perf_counter()
        write_source(folder, random_source(sizes, 32, 40), {"benchmark": "cache_build"}, show_progress=False)
        print(f"wrote the {sum(sizes.values())}-image cache in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    warm = time_verification(folder, args.repeats, cold=False)
    cold = time_verification(folder, args.repeats, cold=True)
    epoch = epoch_estimate(args, sizes["train"])
    total_bytes = sum(p.stat().st_size for p in folder.iterdir())
    return {
        "images": sum(sizes.values()), "splits": sizes, "cache_bytes": total_bytes,
        "verify_warm_seconds": warm, "verify_cold_seconds": cold,
        "verify_warm_GBps": total_bytes / warm / 1e9, "verify_cold_GBps": total_bytes / cold / 1e9,
        "epoch": epoch,
        "verify_warm_over_epoch": warm / epoch["epoch_seconds"],
        "verify_cold_over_epoch": cold / epoch["epoch_seconds"],
        "within_10_percent": max(warm, cold) <= 0.1 * epoch["epoch_seconds"],
    }


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="folder for the JPEG folders and caches (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--images", type=int, nargs="+", default=[20_000, CELEBA_IMAGES],
                        help="image counts of the build measurement (RSS must be flat in N)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="image sizes of the build")
    parser.add_argument("--distinct", type=int, default=2000, help="JPEGs encoded; the other names link to them")
    parser.add_argument("--verify-images", type=int, default=CELEBA_IMAGES, help="size of the verified cache")
    parser.add_argument("--epoch-steps", type=int, default=200, help="timed training steps for the epoch estimate")
    parser.add_argument("--repeats", type=int, default=3, help="verification timings (median)")
    parser.add_argument("--skip-build", action="store_true", help="only the verification measurement")
    parser.add_argument("--skip-verify", action="store_true", help="only the build measurement")
    parser.add_argument("--keep", action="store_true", help="keep the built caches")
    parser.add_argument("--probe-build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--probe-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--probe-cache", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.probe_build is not None:
        result = build_probe(args.probe_build, args.probe_size, args.probe_cache)
        print(json.dumps(result))
        return result
    work = args.work or Path(tempfile.mkdtemp(prefix="mtl_cog_cache_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "python": platform.python_version(), "torch": torch.__version__}}
    if not args.skip_build:
        result["build"] = measure_build(args, work)
    if not args.skip_verify:
        result["verify"] = measure_verify(args, work)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
