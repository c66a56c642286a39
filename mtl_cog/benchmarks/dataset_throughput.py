"""Training images/s of backbones on a real data set: the library's step on batches from its cache.

    python -m mtl_cog.benchmarks.dataset_throughput --config configs/fashion_mosaic/baseline.yaml \
        --backbones cog_cnn_tiny cog_cnn_small --steps 10 [key=value ...]

``throughput.py`` times a backbone on random images with 40 random binary labels; this one times
it on what a run of the given config trains on: the config's data set (through ``load_task``, so
its cache), its task spec (logit layout: mixed class counts included), its augmentation and its
method and batch size. Each backbone runs ``--steps`` timed steps (after one untimed one) on
consecutive training batches; the median step gives images/s. Threads: torch's default, or
``torch.set_num_threads`` before calling; the output records the count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from mtl_cog.benchmarks.common import timed
from mtl_cog.config import Config, load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.loading import load_task
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.trainee import build_trainee


def measure(cfg: Config, backbone: str, steps: int) -> dict:
    """Median training images/s of ``backbone`` under ``cfg`` (its data, method, batch size)."""
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, backbone=backbone))
    data = load_task(cfg.data)
    train = data.splits["train"]
    batch = min(cfg.train.batch_size, len(train))
    accelerator = create_accelerator(None, cfg.train.precision)
    trainee = build_trainee(accelerator, cfg, data.spec.layout, seed=0)
    transform = BatchTransform(data.spec, train=True, device=accelerator.device)
    generator = torch.Generator().manual_seed(0)
    durations = []
    for i in range(steps + 1):
        start = (i * batch) % max(1, len(train) - batch + 1)
        images = train.images[start : start + batch].to(accelerator.device)
        labels = train.labels[start : start + batch].to(accelerator.device)
        work = lambda images=images, labels=labels: trainee.step(transform(images, generator), labels)  # noqa: E731
        durations.append(timed(accelerator.device, work)[0])
    return {"dataset": cfg.data.task, "backbone": backbone, "method": cfg.method.name,
            "image_size": cfg.data.image_size, "batch_size": batch, "tasks": data.spec.num_tasks, "steps": steps,
            "threads": torch.get_num_threads(), "images_per_s": batch / statistics.median(durations[1:])}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="a configs/<data set>/<method>.yaml")
    parser.add_argument("--backbones", nargs="+", required=True, help="timm names, e.g. cog_cnn_tiny cog_cnn_small")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per backbone (median)")
    parser.add_argument("--out", type=Path, help="append one JSON line per backbone here")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. data.cache_dir=/tmp/c")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    results = []
    for backbone in args.backbones:
        result = measure(cfg, backbone, args.steps)
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(result) + "\n")
        results.append(result)
    return results


if __name__ == "__main__":
    main()
