"""Resident memory of a CelebA-sized cache read for a whole epoch, above the model's own. Target <= 1 GiB.

The cache is memory-mapped: an epoch touches every page of 202,599 x 3 x 32 x 32 uint8 images
(~594 MiB), but the kernel may drop clean pages again, so training should never hold the data
set in private memory. Three fresh processes (peak RSS is per process and only grows):

- ``build``: writes the cache (``mtl_cog.data.cache_writer.write_cache``) from random images;
- ``model``: a few COG-FC training steps (the library's step) on one random batch: the model's
  own peak (weights, activations, Adam state);
- ``cache``: the same steps, then one whole training epoch of batches gathered and augmented
  from the memory-mapped cache, plus the evaluation transform over validation and test.

``cache_extra_rss_bytes`` = peak(cache) - peak(model).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from mtl_cog.benchmarks.common import (
    CELEBA_SPLITS,
    NUM_TASKS,
    Workload,
    binary_spec,
    method_config,
    peak_rss_bytes,
    random_split,
)
from mtl_cog.data.batches import BatchTransform, train_batch_indices
from mtl_cog.data.cache import read_cache
from mtl_cog.data.cache_writer import write_cache
from mtl_cog.data.task_api import TaskData
from mtl_cog.errors import ConfigError
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.trainee import build_trainee

CACHE_EXTRA_RSS_TARGET = 2**30  # bytes
MODEL_STEPS = 3  # real steps in both probes, so that the model's own peak (activations, Adam state) is in
PROBES = ("build", "model", "cache")
REPO = Path(__file__).resolve().parents[2]  # the folder holding this mtl_cog package, for the probes' imports


def celeba_proportions(images: int) -> dict[str, int]:
    """``images`` split as CelebA's train/val/test (each >= 1), summing to ``images``."""
    if images < len(CELEBA_SPLITS):
        raise ConfigError(f"--cache-images must be >= {len(CELEBA_SPLITS)} (one image per split). Got {images}.")
    scale = images / sum(CELEBA_SPLITS.values())
    sizes = {k: max(1, round(v * scale)) for k, v in CELEBA_SPLITS.items()}
    sizes["train"] += images - sum(sizes.values())
    return sizes


def run_probe(kind: str, folder: Path, workload: Workload, methods_dir: Path, sizes: dict[str, int]) -> dict:
    """In a fresh process: this probe's work, then its peak RSS (see the module docstring)."""
    if kind == "build":
        splits = {name: random_split(n, workload.image_size, NUM_TASKS, seed=i)
                  for i, (name, n) in enumerate(sizes.items())}
        write_cache(folder, TaskData(binary_spec(NUM_TASKS), splits), {"benchmark": True}, show_progress=False)
        return {"peak_rss_bytes": peak_rss_bytes()}
    spec = binary_spec(NUM_TASKS)
    accelerator = create_accelerator(None, "no")
    trainee = build_trainee(accelerator, method_config(methods_dir, "cog_fc", workload), spec.layout, seed=0)
    transform = BatchTransform(spec, train=True)
    generator = torch.Generator().manual_seed(0)
    batch = random_split(workload.batch_size, workload.image_size, NUM_TASKS, seed=0)
    for _ in range(MODEL_STEPS):
        trainee.step(transform(batch.images, generator), batch.labels)
    if kind == "model":
        return {"peak_rss_bytes": peak_rss_bytes(), "images_read": 0}
    cached = read_cache(folder, None)
    if cached is None:
        raise RuntimeError(f"the build probe left no cache in {folder}")
    train = cached.splits["train"]
    touched = 0
    for idx in train_batch_indices(len(train), workload.batch_size, 0, 1, seed=0, epoch=1):
        transform(train.images[idx], generator)
        touched += len(idx)
    evaluation = BatchTransform(spec, train=False)  # an epoch also evaluates: every page of the cache is read
    for name in ("val", "test"):
        images = cached.splits[name].images
        for start in range(0, len(images), 4 * workload.batch_size):
            touched += len(evaluation(images[start : start + 4 * workload.batch_size]))
    return {"peak_rss_bytes": peak_rss_bytes(), "images_read": touched}


def measure_cache_memory(workload: Workload, methods_dir: Path, work: Path, images: int) -> dict:
    """Run the three probes one after the other, each in its own process."""
    folder = work / "celeba_sized_cache"
    sizes = celeba_proportions(images)
    request = {"workload": dataclasses.asdict(workload), "methods_dir": str(methods_dir), "sizes": sizes}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    results = {}
    for kind in PROBES:
        command = [sys.executable, "-m", __name__, kind, str(folder), json.dumps(request)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        if done.returncode:
            raise RuntimeError(f"memory probe {kind} failed:\n{done.stderr[-3000:]}")
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    image_bytes = sum(np.load(f, mmap_mode="r").nbytes for f in folder.glob("*.images.npy"))  # without headers
    extra = results["cache"]["peak_rss_bytes"] - results["model"]["peak_rss_bytes"]
    return {
        "images": sum(sizes.values()),
        "image_bytes": image_bytes,
        "model_only_peak_rss_bytes": results["model"]["peak_rss_bytes"],
        "model_plus_cache_epoch_peak_rss_bytes": results["cache"]["peak_rss_bytes"],
        "cache_extra_rss_bytes": extra,
        "target_bytes": CACHE_EXTRA_RSS_TARGET,
        "within_1GiB": extra <= CACHE_EXTRA_RSS_TARGET,
        "images_read": results["cache"]["images_read"],
        "build_peak_rss_bytes": results["build"]["peak_rss_bytes"],
        "backbone": workload.backbone,
    }


def probe_main(argv: list[str]) -> None:
    """``python -m mtl_cog.benchmarks.cache_memory KIND FOLDER REQUEST_JSON``: prints one JSON line."""
    kind, folder, raw = argv
    request = json.loads(raw)
    result = run_probe(kind, Path(folder), Workload(**request["workload"]), Path(request["methods_dir"]),
                       request["sizes"])
    print(json.dumps(result))


if __name__ == "__main__":
    probe_main(sys.argv[1:])
