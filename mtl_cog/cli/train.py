"""Train a (multi-task) network with COG or a baseline, evaluate it, and save the run.

    accelerate launch scripts/train_mtl.py [--config configs/<dataset>/<method>.yaml] [key=value ...]
    accelerate launch scripts/train_mtl.py --resume RUN_DIR [key=value ...]   # continue a killed run
    mtl-cog train ...                                                          # the same, once installed

Without arguments it trains COG-FC on the built-in ``synthetic`` data (configs/synthetic/cog_fc.yaml).
The training state is saved at every epoch end (and every ``train.save_every_steps`` steps), so
``--resume`` continues from the last one; on the CPU the result equals an uninterrupted run.
Works the same under plain ``python`` and under ``accelerate launch`` with any number of processes.
The last line printed is the run folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import load_config
from mtl_cog.errors import UserError, run_cli
from mtl_cog.runs import rundir
from mtl_cog.training import fit

DEFAULT_CONFIG = CONFIGS / "synthetic" / "cog_fc.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help=f"YAML experiment config (default {DEFAULT_CONFIG})")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last saved state (overrides apply on top)")
    parser.add_argument("--overwrite", action="store_true", help="replace a run folder that already holds a run")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3 optim.leader_lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.resume is not None:
        if args.config is not None or args.overwrite:
            raise UserError("--resume continues a run with its saved config: no --config or --overwrite with it.")
        rundir.check_resumable(args.resume)
        cfg = load_config(args.resume / rundir.CONFIG, args.overrides)
        if args.overrides:
            print(f"resuming with changed settings: {' '.join(args.overrides)}")
    else:
        cfg = load_config(args.config or DEFAULT_CONFIG, args.overrides)
    return fit(cfg, resume_dir=args.resume, overwrite=args.overwrite).run_dir


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
