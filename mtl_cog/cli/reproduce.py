"""The paper's comparison at CPU scale: every method config × 3 seeds on ``digits`` and ``synthetic``, then the report.

    python scripts/reproduce.py [--out runs/reproduce] [--datasets digits synthetic] [--seeds 0 1 2]
                                [--jobs 2] [--epochs N] [--methods baseline cog_fc ...] [--dry-run]

Every ``configs/<dataset>/*.yaml`` is a method (new method configs are picked up without
changing this script). Each run is ``scripts/train_mtl.py`` in a subprocess with the reduced
sizes below (small CNN, 16×16 images, fewer epochs) so the whole grid fits in about 30 minutes
on 2 CPU cores; ``--jobs`` runs that many at once, each with one torch thread. A finished run
folder (its ``DONE`` file) is reused, so an interrupted reproduction resumes where it stopped.
The post-hoc calibrators are fitted on the
baseline runs (``--posthoc-on``) and appear in the report as ``baseline+<calibrator>``. The report is
``scripts/compare.py <out>/runs --out <out>/report`` (see that script for what it writes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mtl_cog.cli import compare
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import load_config
from mtl_cog.errors import UserError, run_cli
from mtl_cog.runs import rundir

DATASETS = ("digits", "synthetic")
# Sizes that make one run take well under a minute of one CPU core (measured: see README).
# synthetic gets more epochs: its small noisy training set only drifts into overconfidence later.
CPU_SCALE = {
    "digits": ["data.image_size=16", "train.batch_size=64", "train.epochs=15"],
    "synthetic": ["data.image_size=16", "train.batch_size=64", "train.epochs=30",
                  "data.synthetic.train_size=1000", "data.synthetic.val_size=500", "data.synthetic.test_size=1000"],
}
# The CPU-scale backbone is the tiny counterpart of the config's: a LiST network stays Lipschitz.
TINY_BACKBONES = {"cog_lipschitz_small": "cog_lipschitz_tiny"}  # any other backbone -> cog_cnn_tiny
POSTHOC = ["ts", "vs", "ms", "svs", "sms", "isotonic", "histogram", "stability"]
# Methods whose leader is the task heads (cog_fc, cog_ls, cog_tst) update their whole classifier
# at the leader rate; in these short CPU runs the configs' 1e-4 leaves them far underconfident.
# Learning rates chosen like the paper (App. B), on validation NLL, with scripts/sweep.py on
# cog_fc at this scale, two grids: leader_lr in {1e-4, 3e-4, 6e-4} with follower_lr 1e-3, and
# leader_lr in {3e-4, 1e-3} x follower_lr in {2e-3, 4e-3}; both data sets chose 1e-3 / 4e-3.
HEAD_LEADER_LRS = {
    "digits": ["optim.leader_lr=1e-3", "optim.follower_lr=4e-3"],
    "synthetic": ["optim.leader_lr=1e-3", "optim.follower_lr=4e-3"],
}


@dataclass(frozen=True)
class Job:
    dataset: str
    method: str
    seed: int
    config: Path
    run_dir: Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce"), help="OUT/runs and OUT/report")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--methods", nargs="+", default=None, help="only these configs (default: all in configs/<ds>/)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the per-data-set epochs of CPU_SCALE")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each with one torch thread)")
    parser.add_argument("--posthoc-on", nargs="+", default=["baseline"], metavar="METHOD",
                        help="methods whose runs get the post-hoc calibrators (default: baseline, as the paper)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return parser.parse_args(argv)


def plan(datasets: list[str], methods: list[str] | None, seeds: list[int], runs_dir: Path) -> list[Job]:
    jobs = []
    for dataset in datasets:
        configs = sorted((CONFIGS / dataset).glob("*.yaml"))
        if methods is not None:
            missing = sorted(set(methods) - {c.stem for c in configs})
            if missing:
                raise UserError(f"no config configs/{dataset}/<method>.yaml for --methods {', '.join(missing)}; "
                                f"available: {', '.join(c.stem for c in configs)}.")
            configs = [c for c in configs if c.stem in methods]
        for config in configs:
            for seed in seeds:
                jobs.append(Job(dataset, config.stem, seed, config, runs_dir / f"{dataset}-{config.stem}-seed{seed}"))
    return jobs


def heads_lead(config: Path) -> bool:
    return "heads" in load_config(config).method.leader


def tiny_backbone(config: Path) -> str:
    return TINY_BACKBONES.get(load_config(config).model.backbone, "cog_cnn_tiny")


def train_command(job: Job, epochs: int | None) -> list[str]:
    tuned = HEAD_LEADER_LRS[job.dataset] if heads_lead(job.config) else []
    overrides = [f"model.backbone={tiny_backbone(job.config)}", *CPU_SCALE[job.dataset], *tuned,
                 *([f"train.epochs={epochs}"] if epochs else [])]  # last one wins
    return [sys.executable, "-m", "mtl_cog.cli.train", "--config", str(job.config),
            f"output_dir={job.run_dir.parent}", f"run_name={job.run_dir.name}", f"seed={job.seed}", "tracking=none",
            *overrides]


def posthoc_command(job: Job) -> list[str]:
    return [sys.executable, "-m", "mtl_cog.cli.evaluate", "--run", str(job.run_dir), "--posthoc", *POSTHOC,
            "--out", str(job.run_dir / rundir.POSTHOC_JSON)]


def run_job(job: Job, epochs: int | None, with_posthoc: bool) -> tuple[Job, float, str | None]:
    """Train (unless already finished) and fit post-hoc calibrators; -> (job, seconds, error or None)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    start = time.time()
    commands = [] if (job.run_dir / rundir.DONE).is_file() else [train_command(job, epochs)]
    posthoc_done = any((job.run_dir / name).is_file() for name in (rundir.POSTHOC_METRICS, rundir.POSTHOC_JSON))
    if with_posthoc and not posthoc_done:
        commands.append(posthoc_command(job))
    for command in commands:
        result = subprocess.run(command, env=env, capture_output=True, text=True)  # in the user's folder
        if result.returncode != 0:
            return job, time.time() - start, (result.stderr or result.stdout)[-1500:]
    return job, time.time() - start, None


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.jobs < 1 or (args.epochs is not None and args.epochs < 1):
        raise UserError(f"--jobs and --epochs must be >= 1. Got {args.jobs} and {args.epochs}.")
    runs_dir, report_dir = args.out / "runs", args.out / "report"
    jobs = plan(args.datasets, args.methods, args.seeds, runs_dir)
    print(f"{len(jobs)} runs ({', '.join(args.datasets)} × {len({j.method for j in jobs})} methods × "
          f"{len(args.seeds)} seeds), {args.jobs} at a time; post-hoc calibrators on "
          f"{', '.join(args.posthoc_on)}")
    if args.dry_run:
        for job in jobs:
            print(" ".join(train_command(job, args.epochs)))
        return report_dir
    failures = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool, tqdm(total=len(jobs), unit="run") as bar:
        futures = [pool.submit(run_job, job, args.epochs, job.method in args.posthoc_on)
                   for job in jobs]
        for future in as_completed(futures):
            job, seconds, error = future.result()
            bar.set_postfix_str(f"{job.dataset}/{job.method}/seed{job.seed} {seconds:.0f}s")
            bar.update()
            if error:
                failures.append(job)
                tqdm.write(f"FAILED {job.run_dir}:\n{error}")
    if len(failures) == len(jobs):
        raise UserError("every run failed; see the messages above.")
    compare.main([str(runs_dir), "--out", str(report_dir)])
    if failures:
        print(f"{len(failures)} run(s) failed (training or post-hoc step, messages above): "
              + ", ".join(str(j.run_dir) for j in failures))
    return report_dir


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
