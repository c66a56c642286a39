"""Run every combination of a grid of overrides, pick the lowest validation NLL, write a table.

    python scripts/sweep.py --config configs/digits/cog_ts.yaml train.epochs=5 \
        --grid optim.leader_lr=1e-5,3e-5,1e-4 optim.follower_lr=1e-3,3e-4 [--parallel 2]
    python scripts/sweep.py --data digits --method cog_ts ...   # the same: configs/digits/cog_ts.yaml
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

The sweep is a campaign (``mtl_cog/experiments/campaign.py``): each run is recorded in
``<sweep dir>/bundle/`` as it finishes, and the tables are computed from that bundle alone, so a
sweep folder whose run folders are gone (a fresh clone of a committed bundle) trains nothing again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import yaml

from mtl_cog.bundles.bundle import bundle_dir, read_bundle
from mtl_cog.cli.config_args import combination_file
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import Config, load_config
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import ConfigError, UserError, run_cli
from mtl_cog.experiments import campaign, estimates, gpu_time, reuse
from mtl_cog.experiments.launcher import (
    add_launcher_arguments,
    check_launcher,
    make_launcher,
    processes_per_run,
    thread_env,
)
from mtl_cog.experiments.sweep import best_index, combinations, parse_grid
from mtl_cog.io import atomic_write, atomic_write_json, atomic_write_text, check_writable, make_folder
from mtl_cog.reporting.posthoc_run import posthoc_method_names
from mtl_cog.reporting.tables import markdown_table

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
    parser.add_argument("--data", default=None, metavar="NAME", help="with --method: configs/<NAME>/<method>.yaml")
    parser.add_argument("--method", default=None, metavar="NAME", help="with --data: configs/<data>/<NAME>.yaml")
    parser.add_argument("--grid", nargs="+", default=None, metavar="KEY=V1,V2", help="values to sweep")
    parser.add_argument("--out", type=Path, default=None, help="sweep folder (default runs/sweep-<config>-<time>)")
    parser.add_argument("--resume", type=Path, default=None, metavar="SWEEP_DIR",
                        help="finish the sweep in SWEEP_DIR with its saved settings")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and the estimated time; run nothing")
    parser.add_argument("--gpu-check", type=Path, default=None, metavar="JSON",
                        help="throughput measured by scripts/gpu_check.sh (default ./gpu_check.json if present)")
    parser.add_argument("--posthoc", nargs="+", default=[], metavar="NAME", choices=posthoc_method_names(),
                        help="post-hoc calibrators fitted on each run's validation predictions when it is recorded "
                             "in the bundle (results split test+NAME), e.g. ts")
    add_launcher_arguments(parser)
    campaign.add_campaign_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="fixed overrides for every run, e.g. train.epochs=5")
    args = parser.parse_args(argv)
    if args.data or args.method:
        if args.config is not None or args.resume is not None or not (args.data and args.method):
            raise UserError("--method and --data name the config together, instead of --config or --resume.")
        args.config = combination_file(args.data, args.method)
    if args.resume is not None:
        if args.config is not None or args.grid is not None or args.overrides:
            raise UserError("--resume SWEEP_DIR uses the sweep's saved --config, --grid and overrides; give none.")
        saved = args.resume / SWEEP_ARGS
        if not saved.is_file():
            raise UserError(f"--resume {args.resume}: no {SWEEP_ARGS} there; is it a sweep folder?")
        spec = read_sweep_args(saved)
        args.config, args.grid, args.overrides, args.out = Path(spec["config"]), spec["grid"], spec["overrides"], \
            args.resume
        args.posthoc = spec.get("posthoc", [])  # sweeps saved before --posthoc fitted none
        args.threads = resumed_threads(args.threads, spec, saved)
        if not isinstance(args.posthoc, list) or not set(args.posthoc) <= set(posthoc_method_names()):
            raise UserError(f"--resume: {saved} names post-hoc calibrators {args.posthoc!r}; known: "
                            f"{', '.join(posthoc_method_names())}. Restore the file.")
    elif args.config is None or args.grid is None:
        raise UserError("--config and --grid are required (or --resume SWEEP_DIR).")
    return args


def resumed_threads(given: int | None, spec: dict, saved: Path) -> int | None:
    """The thread count a resumed sweep trains on: the one it started with (sweep_args.json, or its bundle's
    campaign.json for a sweep saved before it was recorded there), which a contradicting --threads cannot change."""
    recorded = spec.get("threads")
    if recorded is not None and (not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 1):
        raise UserError(f"--resume: {saved} records threads {recorded!r}, not a positive whole number. Restore it.")
    recorded = recorded or reuse.recorded_threads(saved.parent)
    if given is not None and recorded is not None and given != recorded:
        raise UserError(f"--resume {saved.parent}: the sweep trained on --threads {recorded}; resuming on {given} "
                        "would give other numbers (a thread count orders float sums). Leave --threads out.")
    return recorded or given


def campaign_of(args: argparse.Namespace, out: Path) -> tuple[campaign.Campaign, list[dict[str, str]]]:
    """(the sweep as a campaign: one spec per grid combination, ``run_NN`` in grid order; the combinations)."""
    combos = combinations(parse_grid(args.grid))
    specs = []
    for i, combo in enumerate(combos):
        overrides = (f"wandb_group=sweep-{out.resolve().name}", "wandb_job_type=sweep", *args.overrides,
                     *(f"{k}={v}" for k, v in combo.items()))
        try:  # the labels need the combination's own data set, method and seed
            cfg = load_config(args.config, list(overrides))
        except ConfigError as err:
            raise ConfigError(f"grid combination {combo}: {err}") from None
        labels = campaign.Labels(cfg.data.task, cfg.method.name, "sweep", cfg.seed, trial=f"{i:02d}")
        name = campaign.run_name(index=i)
        specs.append(campaign.RunSpec(name, (args.config,), overrides, out / name, labels, tuple(args.posthoc)))
    return campaign.Campaign(f"sweep-{args.config.stem}", out, specs), combos


def main(argv: list[str] | None = None, executor=None) -> Path:
    """``executor``: a submitit executor to use instead of Slurm's (the tests pass the local one)."""
    args = parse_args(argv)
    base = load_config(args.config, args.overrides)  # fail fast on a bad config or fixed override
    out = args.out or Path(base.output_dir) / f"sweep-{args.config.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_writable(out, "--out", folder=True)  # what the real sweep would refuse, a dry run refuses too
    plan, combos = campaign_of(args, out)
    planned = campaign.plan(plan)
    print(f"sweep of {len(planned)} runs in {out}", flush=True)
    check_launcher(args, executor)
    parallel = args.parallel or 1
    env = thread_env(parallel, args.threads, gpus=torch_gpus())
    reuse.with_threads(plan, env)  # a thread count the bundle contradicts: refused before anything is written
    if args.dry_run:
        measured = gpu_time.find_gpu_check(args.gpu_check, CONFIGS.parent, args.runs_per_device)
        for p, combo in zip(planned, combos):
            print(f"  {p.spec.run}  {p.state:<10} {' '.join(f'{k}={v}' for k, v in combo.items())}")
        estimates.print_estimate(planned, measured, parallel, out=plan.out)
        return out / "best_config.yaml"
    # a launcher that refuses (no sbatch, a bad --slurm-args item) does so before the sweep folder is written
    launcher = make_launcher(args, out / "slurm_logs", default_parallel=1, executor=executor)
    make_folder(out)  # a file or a read-only folder: one error line
    atomic_write_json(out / SWEEP_ARGS, {"config": str(args.config), "grid": args.grid, "overrides": args.overrides,
                                        "posthoc": args.posthoc, "threads": reuse.env_threads(env)})
    campaign.run(plan, planned, launcher, env, f"mtl-cog sweep --resume {out}", processes_per_run(args))
    return write_results(out, plan, combos, base)


def torch_gpus() -> bool:
    import torch  # only to ask whether runs get GPUs (then torch's own thread default stays)

    return torch.cuda.is_available()


def write_results(out: Path, plan: campaign.Campaign, combos: list[dict[str, str]], base: Config) -> Path:
    """sweep.csv / sweep.md and best_config.yaml, from the sweep's results bundle alone."""
    bundle = read_bundle(bundle_dir(out))
    rows = []
    for spec, combo in zip(plan.specs, combos):
        recorded = bundle.runs[bundle.runs["run"] == spec.run] if bundle is not None else None
        done = recorded is not None and len(recorded) and recorded["status"].iloc[0] == "done"
        scores = validation_means(bundle, spec.run) if done else {"nll": float("nan")}
        reason = "" if done or recorded is None or not len(recorded) else recorded["reason"].iloc[0]
        rows.append({"run": spec.run, **combo, "val_accuracy": scores.get("accuracy"), "val_nll": scores["nll"],
                     "val_brier": scores.get("brier"), "val_ece@15": scores.get("ece@15"),
                     "status": "ok" if done else f"failed ({reason or 'not finished'})"})
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
    spec = plan.specs[chosen]
    config = load_config(list(spec.configs), spec.all_overrides()).to_dict()
    config["run_name"] = None
    config["output_dir"] = base.output_dir
    atomic_write_text(best, f"# chosen by scripts/sweep.py: {rows[chosen]['run']}, lowest validation NLL "
                            f"{rows[chosen]['val_nll']:.4f}\n" + yaml.safe_dump(config, sort_keys=False))
    print(f"chosen: {rows[chosen]['run']} {combos[chosen]} (validation NLL {rows[chosen]['val_nll']:.4f})")
    print(best)
    return best


def validation_means(bundle, run: str) -> dict[str, float]:
    """The task-mean validation metrics of ``run`` at its selected checkpoint, from the bundle."""
    rows = bundle.results[(bundle.results["run"] == run) & (bundle.results["split"] == "val")
                          & (bundle.results["task"] == "mean")]
    return dict(zip(rows["metric"], rows["value"].astype(float)))


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
