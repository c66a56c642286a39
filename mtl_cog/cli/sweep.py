"""Run every combination of a grid of overrides, pick the lowest validation NLL, write a table.

    python scripts/sweep.py --config configs/digits/cog_ts.yaml train.epochs=5 \
        --grid optim.leader_lr=1e-5,3e-5,1e-4 optim.follower_lr=1e-3,3e-4 [--parallel 2]
    python scripts/sweep.py ... --launcher slurm --partition gpu --gpus-per-run 1   # one Slurm job per run
    python scripts/sweep.py --resume SWEEP_DIR          # after Ctrl-C or failures: finish the same sweep
    python scripts/sweep.py ... --dry-run               # the runs and their estimated GPU time; nothing runs

Each combination is one training run in <sweep dir>/run_NN, started in *your* working directory
(relative paths resolve there). The criterion is the validation NLL (mean over tasks) of the run's
best checkpoint, the tuning criterion of the COG paper (App. B). Written to the sweep folder:
sweep.csv and sweep.md (every run: its values, validation accuracy / NLL / Brier / ECE@15,
status) and, only when *every* run finished, best_config.yaml (the chosen run's resolved config,
usable as --config). Positional overrides apply to every run; a --grid item with one value is a
fixed override too.

Re-running (``--resume DIR``, or the same command with ``--out DIR``) reuses finished runs,
*continues* unfinished ones from their last saved state (``train --resume``) and starts the rest.
If any run failed, the table says which, no best setting is chosen from the incomplete grid, and
the exit code is 2. The last line printed is best_config.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import Config, load_config
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import ConfigError, UserError, run_cli
from mtl_cog.experiments import gpu_time
from mtl_cog.experiments.launcher import (
    RunJob,
    add_launcher_arguments,
    check_launcher,
    make_launcher,
    processes_per_run,
    train_command,
)
from mtl_cog.experiments.sweep import (
    DONE,
    UNFINISHED,
    best_index,
    combinations,
    parse_grid,
    run_state,
    validation_scores,
)
from mtl_cog.io import atomic_write, atomic_write_json, atomic_write_text, check_writable, make_folder
from mtl_cog.reporting.tables import markdown_table
from mtl_cog.runs import rundir

SWEEP_ARGS = "sweep_args.json"  # what the sweep was asked: --resume re-reads it


def read_sweep_args(path: Path) -> dict:
    """The saved --config, --grid and overrides of a sweep; a damaged or incomplete file is one error line."""
    try:
        spec = json.loads(path.read_text())
        if not isinstance(spec, dict):
            raise ValueError(f"expected a JSON object, got {type(spec).__name__}")
        strings = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)  # noqa: E731
        if not isinstance(spec.get("config"), str) or not strings(spec.get("grid")) or not spec["grid"] \
                or not strings(spec.get("overrides")):
            raise ValueError('needs "config" (a path), "grid" (a non-empty list of KEY=V1,V2) and "overrides" '
                             "(a list of KEY=VALUE)")
    except (OSError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise UserError(f"--resume: {path} is damaged or incomplete ({err}). Restore it, or give the sweep's "
                        f"--config, --grid and overrides again with --out {path.parent} (its finished runs are "
                        "reused).") from None
    return spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="YAML experiment config")
    parser.add_argument("--grid", nargs="+", default=None, metavar="KEY=V1,V2", help="values to sweep")
    parser.add_argument("--out", type=Path, default=None, help="sweep folder (default runs/sweep-<config>-<time>)")
    parser.add_argument("--resume", type=Path, default=None, metavar="SWEEP_DIR",
                        help="finish the sweep in SWEEP_DIR with its saved settings")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and the estimated time; run nothing")
    parser.add_argument("--gpu-check", type=Path, default=None, metavar="JSON",
                        help="throughput measured by scripts/gpu_check.sh (default ./gpu_check.json if present)")
    add_launcher_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="fixed overrides for every run, e.g. train.epochs=5")
    args = parser.parse_args(argv)
    if args.resume is not None:
        if args.config is not None or args.grid is not None or args.overrides:
            raise UserError("--resume SWEEP_DIR uses the sweep's saved --config, --grid and overrides; give none.")
        saved = args.resume / SWEEP_ARGS
        if not saved.is_file():
            raise UserError(f"--resume {args.resume}: no {SWEEP_ARGS} there; is it a sweep folder?")
        spec = read_sweep_args(saved)
        args.config, args.grid, args.overrides, args.out = Path(spec["config"]), spec["grid"], spec["overrides"], \
            args.resume
    elif args.config is None or args.grid is None:
        raise UserError("--config and --grid are required (or --resume SWEEP_DIR).")
    return args


def plan_runs(args: argparse.Namespace, out: Path) -> tuple[list[dict[str, str]], list[Config], list[str]]:
    """Every combination, its resolved config (all valid before anything runs), and its state."""
    combos = combinations(parse_grid(args.grid))
    configs, states = [], []
    for i, combo in enumerate(combos):
        try:  # every combination is valid before anything runs
            resolved = load_config(args.config, run_overrides(args, combo, out, i))
        except ConfigError as err:
            raise ConfigError(f"grid combination {combo}: {err}") from None
        configs.append(resolved)
        states.append(run_state(out / f"run_{i:02d}", resolved))
    return combos, configs, states


def run_overrides(args: argparse.Namespace, combo: dict[str, str], out: Path, i: int) -> list[str]:
    # the sweep's runs share one W&B group (when tracking=wandb); the user's overrides come after and win
    return [f"wandb_group=sweep-{out.resolve().name}", "wandb_job_type=sweep", *args.overrides,
            *(f"{k}={v}" for k, v in combo.items()), f"output_dir={out}", f"run_name=run_{i:02d}"]


def train_job(args: argparse.Namespace, combo: dict[str, str], out: Path, i: int, state: str) -> RunJob:
    run_dir = out / f"run_{i:02d}"
    command = train_command(run_dir, args.config, run_overrides(args, combo, out, i), state == UNFINISHED,
                            processes_per_run(args))
    return RunJob(f"run_{i:02d}", tuple(command), out / f"run_{i:02d}.log")


def print_plan(combos: list[dict], configs: list[Config], states: list[str], measured) -> float:
    """One line per run (state, values, estimate); -> the total estimated seconds of the runs to do."""
    total = 0.0
    for i, (combo, cfg, state) in enumerate(zip(combos, configs, states)):
        estimate = gpu_time.estimate_run(cfg, measured)
        todo = state != DONE
        total += estimate.seconds if todo else 0.0
        action = {"done": "reuse (finished)", "unfinished": "resume", "new": "train"}[state]
        values = " ".join(f"{k}={v}" for k, v in combo.items())
        print(f"  run_{i:02d}  {action:<16} {values}  ~{gpu_time.format_duration(estimate.seconds)}")
    sources = {gpu_time.estimate_run(cfg, measured).source for cfg in configs}
    print(f"estimated time of the runs still to do: {gpu_time.format_duration(total)} on one device "
          f"(throughput: {'; '.join(sorted(sources))})")
    return total


def main(argv: list[str] | None = None, executor=None) -> Path:
    """``executor``: a submitit executor to use instead of Slurm's (the tests pass the local one)."""
    args = parse_args(argv)
    base = load_config(args.config, args.overrides)  # fail fast on a bad config or fixed override
    out = args.out or Path(base.output_dir) / f"sweep-{args.config.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    combos, configs, states = plan_runs(args, out)
    measured = gpu_time.find_gpu_check(args.gpu_check, CONFIGS.parent)
    print(f"sweep of {len(combos)} runs in {out}", flush=True)
    check_writable(out, "--out", folder=True)  # what the real sweep would refuse, a dry run refuses too
    check_launcher(args, executor)
    if args.dry_run:
        print_plan(combos, configs, states, measured)
        return out / "best_config.yaml"
    # a launcher that refuses (no sbatch, a bad --slurm-args item) does so before the sweep folder is written
    launcher = make_launcher(args, out / "slurm_logs", default_parallel=1, executor=executor)
    make_folder(out)  # a file or a read-only folder: one error line
    atomic_write_json(out / SWEEP_ARGS, {"config": str(args.config), "grid": args.grid, "overrides": args.overrides})
    todo = [i for i, s in enumerate(states) if s != DONE]
    for i in range(len(combos)):
        if states[i] == DONE:
            print(f"[{i + 1}/{len(combos)}] run_{i:02d}: reused (already finished with these settings)", flush=True)
        elif states[i] == UNFINISHED:
            print(f"[{i + 1}/{len(combos)}] run_{i:02d}: unfinished, continues from its last saved state", flush=True)
    try:
        codes = launcher.run([train_job(args, combos[i], out, i, states[i]) for i in todo])
    except KeyboardInterrupt:
        print(f"interrupted: finish this sweep with  mtl-cog sweep --resume {out}", file=sys.stderr)
        raise SystemExit(130) from None
    code_of = dict(zip(todo, codes))
    return write_results(out, combos, [code_of.get(i, 0) for i in range(len(combos))], base)


def write_results(out: Path, combos: list[dict[str, str]], codes: list[int], base: Config) -> Path:
    rows = []
    for i, (combo, code) in enumerate(zip(combos, codes)):
        scores = validation_scores(out / f"run_{i:02d}", base.eval.bins) if code == 0 else {"nll": float("nan")}
        rows.append({"run": f"run_{i:02d}", **combo, "val_accuracy": scores.get("accuracy"), "val_nll": scores["nll"],
                     "val_brier": scores.get("brier"), "val_ece@15": scores.get("ece@15"),
                     "status": "ok" if code == 0 else f"failed (exit {code})"})
    failed = [r["run"] for r in rows if r["status"] != "ok"]
    chosen = best_index([r["val_nll"] for r in rows])
    for i, row in enumerate(rows):
        row["chosen"] = "*" if i == chosen and not failed else ""
    table = pd.DataFrame(rows)
    atomic_write(out / "sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write_text(out / "sweep.md", markdown_table(table))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    best = out / "best_config.yaml"
    if failed:
        best.unlink(missing_ok=True)  # a choice from an earlier, different state of the grid would mislead
        so_far = f" (best of the finished runs so far: {rows[chosen]['run']}, validation NLL " \
                 f"{rows[chosen]['val_nll']:.4f})" if chosen is not None else ""
        raise UserError(f"{len(failed)} of {len(rows)} runs failed ({', '.join(failed)}; logs in {out}); the grid is "
                        f"incomplete, so no best setting was chosen{so_far}. Fix the cause and finish the sweep with "
                        f"mtl-cog sweep --resume {out}")
    config = yaml.safe_load((out / rows[chosen]["run"] / rundir.CONFIG).read_text())
    config["run_name"] = None
    config["output_dir"] = base.output_dir
    atomic_write_text(best, f"# chosen by scripts/sweep.py: {rows[chosen]['run']}, lowest validation NLL "
                            f"{rows[chosen]['val_nll']:.4f}\n" + yaml.safe_dump(config, sort_keys=False))
    print(f"chosen: {rows[chosen]['run']} {combos[chosen]} (validation NLL {rows[chosen]['val_nll']:.4f})")
    print(best)
    return best


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
