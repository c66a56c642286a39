"""Tuning worker: trains trials of one Optuna study until it holds its budget (the fair protocol runs these).

    python -m mtl_cog.cli.tune --storage sqlite:///OUT/tuning/optuna.db --study digits-cog_fc \\
        --config configs/digits/cog_fc.yaml --base-follower-lr 1e-3 --budget 8 [--prune] -- key=value ...

``scripts/reproduce.py --protocol fair`` starts one or more of these per study, locally or as
Slurm jobs (the same launchers as every run); several workers may share a study. Each trial is
one training run in ``<output_dir>/trial_NN`` (the overrides after ``--`` are the protocol's:
scale, seed, output folder), trained in this process so that successive halving can stop it
between epochs. A worker killed mid-trial leaves the run folder's saved state; the next worker
retries that trial with the same parameters and continues the folder
(``mtl_cog/experiments/tuning.py``). Exit code 0 when the study has its budget of trials.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna

from mtl_cog.config import Config, load_config
from mtl_cog.errors import run_cli
from mtl_cog.experiments import protocol, tuning
from mtl_cog.experiments.sweep import DONE, UNFINISHED, run_state, validation_scores
from mtl_cog.training import fit
from mtl_cog.training.loop import EpochEnd, Hooks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", required=True, help="Optuna storage URL (sqlite:///.../optuna.db)")
    parser.add_argument("--study", required=True, help="study name, <dataset>-<method>")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--base-follower-lr", type=float, required=True, help="f0, the centre of the rate range")
    parser.add_argument("--budget", type=int, required=True, help="trials of the study (every method the same)")
    parser.add_argument("--prune", action="store_true", help="successive halving on the per-epoch validation NLL")
    parser.add_argument("overrides", nargs="*", help="the protocol's overrides (after --)")
    return parser.parse_args(argv)


def pruning_hook(trial: optuna.Trial) -> Hooks:
    """Report each stage-one epoch's validation NLL; stop the run when successive halving says so."""
    def on_epoch_end(end: EpochEnd) -> None:
        if end.stage != "stage_one":
            return
        trial.report(float(end.val["mean"]["nll"]), end.epoch)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned after epoch {end.epoch}")
    return Hooks(on_epoch_end=on_epoch_end)


def trial_config(args: argparse.Namespace, setting: dict[str, float], run_dir: Path) -> Config:
    return load_config(args.config, [*args.overrides, *protocol.as_overrides(setting), f"output_dir={run_dir.parent}",
                                     f"run_name={run_dir.name}"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = load_config(args.config, args.overrides)
    knobs = protocol.search_space(base, args.base_follower_lr)
    folder = Path(base.output_dir)
    study = tuning.open_study(args.storage, args.study, base.train.epochs, args.prune, args.budget, knobs)
    tuning.enqueue_start(study, knobs, args.budget)

    def objective(trial: optuna.Trial) -> float:
        setting = protocol.resolve(tuning.suggest(trial, knobs))
        run_dir = folder / f"trial_{tuning.first_attempt(trial):02d}"
        trial.set_user_attr("overrides", " ".join(protocol.as_overrides(setting)))
        trial.set_user_attr("run", run_dir.name)
        cfg = trial_config(args, setting, run_dir)
        state = run_state(run_dir, cfg)
        print(f"{args.study} trial {trial.number} ({run_dir.name}): {' '.join(protocol.as_overrides(setting))}"
              + {DONE: ", already trained", UNFINISHED: ", continues its run"}.get(state, ""), flush=True)
        if state != DONE:
            fit(cfg, resume_dir=run_dir if state == UNFINISHED else None,
                hooks=pruning_hook(trial) if args.prune else None)
        return validation_scores(run_dir, cfg.eval.bins)["nll"]

    while tuning.has_work(study, args.budget):
        study.optimize(objective, n_trials=1)
    return 0


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
