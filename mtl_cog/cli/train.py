"""Train a (multi-task) network with COG or a baseline, evaluate it, and save the run.

    accelerate launch scripts/train_mtl.py [--data <dataset> --method <method>] [--config extra.yaml] [key=value ...]
    accelerate launch scripts/train_mtl.py --config configs/<dataset>/<method>.yaml [key=value ...]   # the same
    mtl-cog train --data synthetic --method cog_ts --out runs/tour        # the run folder goes in runs/tour/
    accelerate launch scripts/train_mtl.py --resume RUN_DIR [key=value ...]   # continue a killed run
    python scripts/train_mtl.py --config ... --dry-run [--gpu-check gpu_check.json]  # the plan and its time
    mtl-cog train ...                                                          # the same, once installed

Without arguments it trains COG-FC on the built-in ``synthetic`` data (configs/synthetic/cog_fc.yaml).
The training state is saved at every epoch end (and every ``train.save_every_steps`` steps), so
``--resume`` continues from the last one; on the CPU the result equals an uninterrupted run.
Works the same under plain ``python`` and under ``accelerate launch`` with any number of processes.
The last line printed is the run folder. ``--dry-run`` prints the resolved settings, the data
sizes and the estimated time of the run (from scripts/gpu_check.sh's JSON when there is one, else
stated defaults: mtl_cog/experiments/gpu_time.py) and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.cli.config_args import add_config_arguments, add_out_argument, given, overrides, resolve_files
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import Config, load_config, method_identity
from mtl_cog.config.arguments import Parser
from mtl_cog.config.loader import with_overrides
from mtl_cog.errors import UserError, run_cli
from mtl_cog.experiments import gpu_time
from mtl_cog.runs import rundir
from mtl_cog.training import fit
from mtl_cog.training.preflight import check_before_writing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    add_out_argument(parser)
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last saved state (overrides apply on top)")
    parser.add_argument("--overwrite", action="store_true", help="replace a run folder that already holds a run")
    parser.add_argument("--dry-run", action="store_true", help="print the settings and the estimated time; no run")
    parser.add_argument("--gpu-check", type=Path, default=None, metavar="JSON",
                        help="with --dry-run: throughput from scripts/gpu_check.sh (default ./gpu_check.json)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3 optim.leader_lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.resume is not None:
        if given(args) or args.overwrite or args.out is not None:
            raise UserError("--resume continues a run in its own folder with its saved config: no --config, "
                            "--overwrite or --out with it (nor --data, --method).")
        rundir.check_resumable(args.resume)
        saved = load_config(args.resume / rundir.CONFIG)  # read once: fit diffs against this very config
        cfg = with_overrides(saved, args.overrides)
        if args.overrides:
            print(f"resuming with changed settings: {' '.join(args.overrides)}")
    else:
        saved, cfg = None, load_config(resolve_files(args), overrides(args))
    if args.dry_run:
        check_before_writing(cfg, args.resume, args.overwrite, saved)  # the real run's checks: both refuse alike
        return dry_run(cfg, args.gpu_check)
    return fit(cfg, resume_dir=args.resume, overwrite=args.overwrite, saved_config=saved).run_dir


def dry_run(cfg: Config, gpu_check: Path | None) -> Path:
    """The resolved settings, data sizes and estimated time of ``cfg``; nothing is written."""
    method = cfg.method
    leader = "+".join(method.leader) or "none (standard training)"
    lines = [
        f"method {method.name}: calibrator {method.calibrator}, leader {leader}, loss {method.loss}, "
        f"mtl.aggregator {cfg.mtl.aggregator}",
        f"data {cfg.data.task} @ {cfg.data.image_size} px (root {cfg.data.root}, max_samples {cfg.data.max_samples})",
        f"model {cfg.model.backbone} (cifar_stem {cfg.model.cifar_stem}, head {cfg.model.head})",
        f"train {cfg.train.epochs} epochs, batch {cfg.train.batch_size} (global), precision {cfg.train.precision}; "
        f"follower_lr {cfg.optim.follower_lr:g}" + (f", leader_lr {cfg.optim.leader_lr:g}" if method.leader else "")
        + f", / {1 / cfg.optim.lr_gamma:g} every {cfg.optim.lr_step_epochs} epochs",
    ]
    if cfg.two_stage.enabled:
        lines.append(f"two-stage: {cfg.two_stage.head} head, up to {cfg.two_stage.epochs} epochs at lr "
                     f"{cfg.two_stage.lr:g} (patience {cfg.two_stage.patience})")
    estimate = gpu_time.estimate_run(cfg, gpu_time.find_gpu_check(gpu_check, CONFIGS.parent))
    if estimate.sizes is not None:
        lines.append("data sizes train/val/test " + "/".join(f"{n:,}" for n in estimate.sizes.values()))
    lines.append(f"estimated time: {gpu_time.format_duration(estimate.seconds)} on one device ({estimate.source})")
    name = cfg.run_name or rundir.default_run_name(cfg.data.task, method_identity(cfg.to_dict()), cfg.seed)
    run_dir = Path(cfg.output_dir) / name
    lines.append(f"dry run: nothing written; the run folder would be {run_dir}")
    print("\n".join(lines))
    return run_dir


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
