"""The config a command runs: ``--data``/``--method`` composed from ``configs/``, ``--config`` files, overrides.

    mtl-cog train --data celeba --method cog_fc [--config extra.yaml ...] [key=value ...]
    mtl-cog train --config configs/celeba/cog_fc.yaml [key=value ...]        # the same run
    mtl-cog train --data celeba --method cog_fc --out runs/celeba             # the run folder goes in runs/celeba

``--data <d> --method <m>`` stands for ``configs/<d>/<m>.yaml`` (``mtl_cog.config.compose``); each
``--config`` file is merged on top in the order given, then the ``key=value`` overrides. ``--out DIR``
is the folder the run creates its own folder in (config key ``output_dir``), the flag every command that
writes takes; ``output_dir=DIR`` still works as an override.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.compose import DATASETS, METHODS, available, combination_path, config_files
from mtl_cog.errors import UserError

DEFAULT_DATA, DEFAULT_METHOD = "synthetic", "cog_fc"


def add_config_arguments(parser: argparse.ArgumentParser, default: bool = True) -> None:
    """``--data``, ``--method`` and a repeatable ``--config``; ``default``: no option means synthetic x cog_fc."""
    fallback = f" (default {DEFAULT_DATA} and {DEFAULT_METHOD} when only the other is given" + (
        ", or when neither nor --config is)" if default else ")")
    parser.add_argument("--data", default=None, metavar="NAME",
                        help=f"data set: configs/{DATASETS}/NAME.yaml ({', '.join(available(CONFIGS, DATASETS))})")
    parser.add_argument("--method", default=None, metavar="NAME",
                        help=f"method: configs/{METHODS}/NAME.yaml ({', '.join(available(CONFIGS, METHODS))})"
                        + fallback)
    parser.add_argument("--config", type=Path, action="append", default=None, metavar="YAML",
                        help="YAML experiment config; with --data/--method, or repeated, merged on top in order")


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``: where the run creates its folder (``output_dir``)."""
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="the folder the run creates its own folder in (config key output_dir; default runs)")


def overrides(args: argparse.Namespace) -> list[str]:
    """The ``key=value`` overrides, with ``--out DIR`` as ``output_dir=DIR`` first; both at once are refused."""
    if args.out is None:
        return list(args.overrides)
    if any(item.startswith("output_dir=") for item in args.overrides):
        raise UserError("--out and output_dir= both name the folder for the run: give one of them.")
    return [f"output_dir={args.out}", *args.overrides]


def given(args: argparse.Namespace) -> bool:
    """Whether any of ``--data``, ``--method``, ``--config`` was given."""
    return bool(args.data or args.method or args.config)


def resolve_files(args: argparse.Namespace, default: bool = True) -> list[Path]:
    """The YAML files, in merge order, that the options name ([] when none and ``default`` is off)."""
    files = list(args.config or [])
    if args.data or args.method or (default and not files):
        files = config_files(CONFIGS, args.data or DEFAULT_DATA, args.method or DEFAULT_METHOD) + files
    return files


def combination_file(dataset: str, method: str) -> Path:
    """``configs/<dataset>/<method>.yaml``, the one file a sweep records and every run reads."""
    files = config_files(CONFIGS, dataset, method)
    if len(files) != 1:
        raise UserError(f"--data {dataset} --method {method}: {combination_path(CONFIGS, dataset, method)} "
                        "does not exist yet; run scripts/generate_configs.py.")
    return files[0]
