"""Decode a data set once into its memory-mapped uint8 cache (what training would do on first use).

    python scripts/prepare_data.py --task celeba --data-root /data [--image-size 32] [--cache-dir DIR]
    python scripts/prepare_data.py --config configs/celeba/cog_fc.yaml data.root=/data

Prints the cache folder and the size of each split. Running it again is instant while the source
files are unchanged; a changed source (size or modification time), reader or option rebuilds it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import tasks  # noqa: F401  (registers the data sets)
from mtl_cog.config import load_config
from mtl_cog.data.cache import cache_dir
from mtl_cog.data.loading import load_task
from mtl_cog.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="experiment YAML whose data section to use")
    parser.add_argument("--task", help="data.task (e.g. celeba)")
    parser.add_argument("--data-root", help="data.root: the folder holding the official files")
    parser.add_argument("--image-size", type=int, help="data.image_size")
    parser.add_argument("--max-samples", type=int, help="data.max_samples")
    parser.add_argument("--cache-dir", help="data.cache_dir (default <data.root>/.mtl_cog_cache)")
    parser.add_argument("overrides", nargs="*", help="further dotted overrides, e.g. data.download=true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    flags = {"data.task": args.task, "data.root": args.data_root, "data.image_size": args.image_size,
             "data.max_samples": args.max_samples, "data.cache_dir": args.cache_dir}
    overrides = [f"{key}={value}" for key, value in flags.items() if value is not None] + args.overrides
    cfg = load_config(args.config, overrides + ["data.use_cache=true"])
    start = time.perf_counter()
    task_data = load_task(cfg.data)
    folder = cache_dir(cfg.data)
    sizes = ", ".join(f"{name} {len(split)}" for name, split in task_data.splits.items())
    nbytes = sum(split.images.numel() for split in task_data.splits.values())
    print(f"{cfg.data.task}: {sizes} images of {cfg.data.image_size}x{cfg.data.image_size} "
          f"({nbytes / 2**20:.1f} MiB uint8) ready in {time.perf_counter() - start:.1f} s")
    print(folder)
    return folder


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
