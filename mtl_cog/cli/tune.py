"""Tuning worker: trains trials of one Optuna study until it holds its budget (the fair protocol runs these).

    python -m mtl_cog.cli.tune --storage sqlite:///OUT/tuning/optuna.db --study digits-cog_fc \\
        --config configs/digits/cog_fc.yaml --base-follower-lr 1e-3 --budget 8 [--prune] \
        [--trial-seeds 1000 1001 1002] -- key=value ...

``scripts/reproduce.py --protocol fair`` starts one or more of these per study, locally or as
Slurm jobs (the same launchers as every run); several workers may share a study. Each trial is
one training run per tuning seed, ``<output_dir>/trial_NN`` with one seed or
``trial_NN-seed<S>`` with several (the overrides after ``--`` are the protocol's: scale, seed,
output folder), trained in this process so that successive halving can stop it between epochs;
its value is the mean of its runs' best validation NLL. A worker killed mid-trial leaves the run
folders' saved state; the next worker retries that trial with the same parameters and continues
them (``mtl_cog/experiments/tuning.py``). Exit code 0 when the study has its budget of trials.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna

from mtl_cog.config import Config, load_config
from mtl_cog.errors import UserError, run_cli
from mtl_cog.experiments import protocol, tuning
from mtl_cog.experiments.sweep import DONE, UNFINISHED, run_state, validation_scores
from mtl_cog.reporting.trajectories import read_metrics_lines
from mtl_cog.runs import rundir
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
    parser.add_argument("--trial-seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="train every trial once per seed, its value the mean (default: the config's seed)")
    parser.add_argument("overrides", nargs="*", help="the protocol's overrides (after --)")
    return parser.parse_args(argv)


def pruning_hook(trial: optuna.Trial, run_dir: Path) -> Hooks:
    """After each stage-one epoch, report the validation NLL the trial would score if it stopped now;
    stop the run when successive halving says so.

    That is the NLL of the checkpoint the run keeps (chosen on validation Brier), the number the
    study ranks finished trials by (``validation_scores``), not the epoch's own NLL: at a rung the
    pruner then compares what each trial has *earned*, and one noisy epoch after a good checkpoint
    does not end a trial whose kept checkpoint is among the best (on fashion_mnist a COG-FC trial
    was pruned at epoch 9 of 10 on a spike, 0.718, above its kept 0.648).
    """
    def on_epoch_end(end: EpochEnd) -> None:
        if end.stage != "stage_one":
            return
        trial.report(kept_checkpoint_nll(end, run_dir), end.epoch)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned after epoch {end.epoch}")
    return Hooks(on_epoch_end=on_epoch_end)


def kept_checkpoint_nll(end: EpochEnd, run_dir: Path) -> float:
    """Mean validation NLL at ``end.best_epoch``: this epoch's when it improved, else from metrics.jsonl
    (its line is written before the hook runs; reading it also serves a trial resumed after a kill)."""
    if end.improved:
        return float(end.val["mean"]["nll"])
    epochs, _ = read_metrics_lines(run_dir)
    kept = [line for line in epochs if line["epoch"] == end.best_epoch]  # stage two writes its own file
    if not kept:
        raise UserError(f"{run_dir / rundir.METRICS}: no line for epoch {end.best_epoch}, the run's kept checkpoint; "
                        f"the run folder is damaged. Delete {run_dir} and run the tuning again (the trial retrains).")
    return float(kept[-1]["val"]["nll"])


def trial_config(args: argparse.Namespace, setting: dict[str, float], seed: int, run_dir: Path) -> Config:
    return load_config(args.config, [*args.overrides, f"seed={seed}", *protocol.as_overrides(setting),
                                     f"output_dir={run_dir.parent}", f"run_name={run_dir.name}"])


def trial_runs(folder: Path, number: int, seeds: list[int]) -> list[tuple[int, Path]]:
    """(seed, run folder) of trial ``number``: ``trial_NN`` with one seed, ``trial_NN-seed<S>`` with several."""
    name = f"trial_{number:02d}"
    return [(seeds[0], folder / name)] if len(seeds) == 1 else [(s, folder / f"{name}-seed{s}") for s in seeds]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = load_config(args.config, args.overrides)
    knobs = protocol.search_space(base, args.base_follower_lr)
    folder = Path(base.output_dir)
    seeds = args.trial_seeds or [base.seed]
    if args.prune and len(seeds) > 1:  # the pruner would see one seed's epochs and rank the mean of several
        raise UserError(f"--prune with {len(seeds)} tuning seeds: successive halving stops a trial on one run's "
                        "epochs, while its value is the mean over seeds. Use one tuning seed, or no --prune.")
    study = tuning.open_study(args.storage, args.study, base.train.epochs, args.prune, args.budget, knobs, seeds)
    tuning.enqueue_start(study, knobs, args.budget)

    def objective(trial: optuna.Trial) -> float:
        setting = protocol.resolve(tuning.suggest(trial, knobs))
        runs = trial_runs(folder, tuning.first_attempt(trial), seeds)
        trial.set_user_attr("overrides", " ".join(protocol.as_overrides(setting)))
        trial.set_user_attr("run", " ".join(run_dir.name for _, run_dir in runs))
        nlls = []
        for seed, run_dir in runs:
            cfg = trial_config(args, setting, seed, run_dir)
            state = run_state(run_dir, cfg)
            print(f"{args.study} trial {trial.number} ({run_dir.name}): {' '.join(protocol.as_overrides(setting))}"
                  + {DONE: ", already trained", UNFINISHED: ", continues its run"}.get(state, ""), flush=True)
            if state != DONE:
                fit(cfg, resume_dir=run_dir if state == UNFINISHED else None,
                    hooks=pruning_hook(trial, run_dir) if args.prune else None)
            nlls.append(validation_scores(run_dir, cfg.eval.bins)["nll"])
        return sum(nlls) / len(nlls)  # NaN (a failed trial) if a run did not finish

    while tuning.has_work(study, args.budget):
        study.optimize(objective, n_trials=1)
    return 0


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
