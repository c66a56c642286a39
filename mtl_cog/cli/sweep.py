"""Run every combination of a grid of overrides, pick the lowest validation NLL, write a table.

    python scripts/sweep.py --config configs/digits/cog_ts.yaml train.epochs=5 \
        --grid optim.leader_lr=1e-5,3e-5,1e-4 optim.follower_lr=1e-3,3e-4 [--parallel 2]

Each combination is one run of scripts/train_mtl.py (a subprocess) in <sweep dir>/run_NN; the
criterion is the validation NLL (mean over tasks) of the run's best checkpoint, the tuning
criterion of the COG paper (App. B). Written to the sweep folder: sweep.csv and sweep.md (every
run: its values, validation accuracy / NLL / Brier / ECE@15, status) and best_config.yaml (the
chosen run's resolved config, usable as --config). Positional overrides apply to every run; a
--grid item with one value is a fixed override too. With --parallel N, N runs at a time (on a
machine with GPUs, run i gets GPU i mod #GPUs). The last line printed is best_config.yaml.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from mtl_cog.config import Config, load_config
from mtl_cog.errors import ConfigError, UserError, run_cli
from mtl_cog.experiments.sweep import best_index, combinations, parse_grid, validation_scores
from mtl_cog.io import atomic_write, atomic_write_text, make_folder
from mtl_cog.runs import rundir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="YAML experiment config")
    parser.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2", help="values to sweep")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="sweep folder (default runs/sweep-<config>-<time>)")
    parser.add_argument("overrides", nargs="*", help="fixed overrides for every run, e.g. train.epochs=5")
    return parser.parse_args(argv)


def launch(command: list[str], log: Path, gpu: int | None) -> subprocess.Popen:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    handle = open(log, "w")  # noqa: SIM115  (closed when the process is collected)
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)  # in the user's folder
    process.log_handle = handle  # type: ignore[attr-defined]
    return process


def run_all(commands: list[list[str] | None], logs: list[Path], parallel: int) -> list[int]:
    """Run the commands, at most ``parallel`` at a time; return their exit codes in order.

    ``None`` stands for a run that already finished with the same settings: it is reused (code 0).
    """
    gpus = torch.cuda.device_count()
    codes: list[int | None] = [0 if c is None else None for c in commands]
    for i in (i for i, c in enumerate(commands) if c is None):
        print(f"[{i + 1}/{len(commands)}] reused: run_{i:02d} already finished with these settings", flush=True)
    running: dict[int, subprocess.Popen] = {}
    pending = [i for i, c in enumerate(commands) if c is not None]
    while pending or running:
        while pending and len(running) < parallel:
            i = pending.pop(0)
            print(f"[{i + 1}/{len(commands)}] {' '.join(commands[i][2:])}", flush=True)
            running[i] = launch(commands[i], logs[i], i % gpus if gpus else None)
        for i, process in list(running.items()):
            if process.poll() is not None:
                process.log_handle.close()  # type: ignore[attr-defined]
                codes[i] = process.returncode
                status = "done" if process.returncode == 0 else f"FAILED (exit {process.returncode}, see {logs[i]})"
                print(f"[{i + 1}/{len(commands)}] {status}", flush=True)
                del running[i]
        time.sleep(0.2)
    return [int(c) for c in codes]


def finished_with(run_dir: Path, resolved: Config) -> bool:
    """Whether ``run_dir`` already holds a finished run of exactly this config (a re-run sweep reuses it).

    A finished run with other settings is refused: its folder name would now mean something else.
    """
    if not (run_dir / rundir.DONE).exists():
        return False
    if rundir.load_run_config(run_dir).to_dict() != resolved.to_dict():
        raise UserError(f"{run_dir} holds a finished run with other settings than this sweep's; "
                        "choose another --out.")
    return True


def markdown_table(table: pd.DataFrame) -> str:
    """A Markdown table (pandas' to_markdown needs the tabulate package, which we do not require)."""
    def cell(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.parallel < 1:
        raise UserError(f"--parallel must be >= 1. Got {args.parallel}.")
    combos = combinations(parse_grid(args.grid))
    base = load_config(args.config, args.overrides)  # fail fast on a bad config or fixed override
    out = args.out or Path(base.output_dir) / f"sweep-{args.config.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    commands, logs = [], []
    for i, combo in enumerate(combos):
        overrides = [*args.overrides, *(f"{k}={v}" for k, v in combo.items()), f"output_dir={out}",
                     f"run_name=run_{i:02d}"]
        try:
            resolved = load_config(args.config, overrides)  # every combination is valid before anything runs
        except ConfigError as err:
            raise ConfigError(f"grid combination {combo}: {err}") from None
        commands.append(None if finished_with(out / f"run_{i:02d}", resolved) else
                        [sys.executable, "-m", "mtl_cog.cli.train", "--config", str(args.config), *overrides])
        logs.append(out / f"run_{i:02d}.log")
    make_folder(out)  # a file or a read-only folder: one error line
    print(f"sweep of {len(combos)} runs in {out}", flush=True)
    codes = run_all(commands, logs, args.parallel)

    rows = []
    for i, (combo, code) in enumerate(zip(combos, codes)):
        scores = validation_scores(out / f"run_{i:02d}", base.eval.bins) if code == 0 else {"nll": float("nan")}
        rows.append({"run": f"run_{i:02d}", **combo, "val_accuracy": scores.get("accuracy"), "val_nll": scores["nll"],
                     "val_brier": scores.get("brier"), "val_ece@15": scores.get("ece@15"),
                     "status": "ok" if code == 0 else f"failed (exit {code})"})
    chosen = best_index([r["val_nll"] for r in rows])
    for i, row in enumerate(rows):
        row["chosen"] = "*" if i == chosen else ""
    table = pd.DataFrame(rows)
    atomic_write(out / "sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write_text(out / "sweep.md", markdown_table(table))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if chosen is None:
        raise UserError(f"no run of the sweep finished; see the logs in {out}.")
    config = yaml.safe_load((out / rows[chosen]["run"] / rundir.CONFIG).read_text())
    config["run_name"] = None
    config["output_dir"] = base.output_dir
    atomic_write_text(out / "best_config.yaml",
                      f"# chosen by scripts/sweep.py: {rows[chosen]['run']}, lowest validation NLL "
                      f"{rows[chosen]['val_nll']:.4f}\n" + yaml.safe_dump(config, sort_keys=False))
    print(f"chosen: {rows[chosen]['run']} {combos[chosen]} (validation NLL {rows[chosen]['val_nll']:.4f})")
    print(out / "best_config.yaml")
    return out / "best_config.yaml"


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
