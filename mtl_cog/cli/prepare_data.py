"""Decode a data set once into its memory-mapped uint8 cache (what training would do on first use).

    python scripts/prepare_data.py --data celeba --data-root /data [--image-size 32] [--cache-dir DIR]
    python scripts/prepare_data.py --config configs/celeba/cog_fc.yaml data.root=/data
    python scripts/prepare_data.py --data celeba --data-root /data --rebuild   # decode again regardless
    python scripts/prepare_data.py --config configs/fashion_mosaic/baseline.yaml --describe 15   # + label statistics

Prints the cache folder and the size of each split. Running it again only verifies the cache
(checksums, labels) while the source files are unchanged; a changed source (size or
modification time), reader or option, or damaged cache content, rebuilds it. The cache holds
every sample: ``data.max_samples`` does not change it (a capped run reads a prefix). Several
processes or nodes may run this at once: one builds, the others wait and then read its cache.
``--describe K`` also prints, as Markdown, every task's prevalence per split and the K most
correlated task pairs (``mtl_cog.reporting.data_description``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mtl_cog.config import load_config
from mtl_cog.config.arguments import Parser, add_deprecated_alias, whole_number
from mtl_cog.data.cache import cache_dir, load_cached, rebuild
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import ConfigError, UnknownNameError, run_cli
from mtl_cog.reporting.data_description import describe_markdown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="experiment YAML whose data section to use")
    parser.add_argument("--data", help="data.task, the data set (e.g. celeba)")
    add_deprecated_alias(parser, "--task", "--data")
    parser.add_argument("--data-root", help="data.root: the folder holding the official files")
    parser.add_argument("--image-size", type=whole_number(1, None, "a size in pixels >= 1"), help="data.image_size")
    parser.add_argument("--cache-dir", help="data.cache_dir (default <data.root>/.mtl_cog_cache)")
    parser.add_argument("--rebuild", action="store_true", help="decode and write the cache again even if it is valid")
    parser.add_argument("--describe", type=int, metavar="K", help="also print the prevalence of every task and "
                        "the K most correlated task pairs (Markdown)")
    parser.add_argument("overrides", nargs="*", help="further dotted overrides, e.g. data.download=true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    flags = {"data.task": args.data, "data.root": args.data_root, "data.image_size": args.image_size,
             "data.cache_dir": args.cache_dir}
    overrides = [f"{key}={value}" for key, value in flags.items() if value is not None] + args.overrides
    cfg = load_config(args.config, overrides + ["data.use_cache=true"])
    try:
        task = TASKS.get(cfg.data.task)
    except UnknownNameError as err:
        raise ConfigError(f"data.task: {err}") from None
    start = time.perf_counter()
    task_data = (rebuild if args.rebuild else load_cached)(task, cfg.data)
    folder = cache_dir(cfg.data)
    sizes = ", ".join(f"{name} {len(split)}" for name, split in task_data.splits.items())
    nbytes = sum(split.images.numel() for split in task_data.splits.values())
    print(f"{cfg.data.task}: {sizes} images of {cfg.data.image_size}x{cfg.data.image_size} "
          f"({nbytes / 2**20:.1f} MiB uint8) verified and ready in {time.perf_counter() - start:.1f} s")
    print(folder)
    if args.describe is not None:
        print(describe_markdown(task_data, args.describe))
    return folder


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
