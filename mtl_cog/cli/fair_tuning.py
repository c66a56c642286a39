"""The fair protocol's tuning stage for ``scripts/reproduce.py``: its Optuna studies' workers, plan and choice.

``reproduce.py --protocol fair`` builds one ``tuning.StudySpec`` per (data set, method) and calls
``run`` (start the workers, locally or on Slurm, until every study holds ``--budget`` trials),
``choose_settings`` (the chosen setting per study, trials.csv, refused while a study is
incomplete) and ``print_plan`` (the dry run's tuning lines, with and without pruning). The
study mechanics are in ``mtl_cog/experiments/tuning.py``; the protocol in docs/protocol.md.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from mtl_cog.config import load_config
from mtl_cog.errors import UserError
from mtl_cog.experiments import gpu_time, protocol, tuning
from mtl_cog.experiments.launcher import LocalLauncher, RunJob, processes_per_run, python_module_command
from mtl_cog.io import atomic_write

Studies = dict[tuple[str, str], tuning.StudySpec]


def study_url(args: argparse.Namespace) -> str:
    return args.study_storage or tuning.storage_url(args.out / "tuning")


def run(studies: Studies, args: argparse.Namespace, runner) -> None:
    """Start the studies' workers with ``runner`` (local or Slurm) until every study holds its budget."""
    tuning.check_processes(processes_per_run(args))
    (args.out / "tuning").mkdir(parents=True, exist_ok=True)
    workers = args.tune_workers or ((args.parallel or 2) if isinstance(runner, LocalLauncher) else 4)
    env = (("WANDB_MODE", "offline"),) + ((("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"))
                                         if args.scale == "cpu" else ())
    jobs, complete = [], 0
    for spec in studies.values():
        study = tuning.open_study(study_url(args), spec.name, spec.epochs, args.prune, args.budget, spec.knobs,
                                   spec.trial_seeds)
        tuning.enqueue_start(study, list(spec.knobs), args.budget)
        tuning.settle_stale(study)
        if not tuning.has_work(study, args.budget):
            complete += 1
            continue
        command = python_module_command("mtl_cog.cli.tune", tuning.worker_args(spec, study_url(args), args.budget,
                                                                               args.prune))
        jobs += [RunJob(f"{spec.dataset}/{spec.method}/worker{i}", tuple(command), spec.folder / f"worker{i}.log",
                        env=env) for i in range(min(workers, args.budget))]
        spec.folder.mkdir(parents=True, exist_ok=True)
    print(f"tuning: {len(studies)} studies of {args.budget} trials, {complete} already complete, "
          f"{len(jobs)} worker(s) to run", flush=True)
    if not jobs:
        return
    try:
        runner.run(jobs)
    except KeyboardInterrupt:
        print(f"interrupted: the same command continues where it stopped (--out {args.out}).", file=sys.stderr)
        raise SystemExit(130) from None


def tuning_todo(spec: tuning.StudySpec, args: argparse.Namespace) -> int:
    """Trials of ``spec`` not yet finished (all of them when no study file exists yet: a dry run writes none)."""
    url = study_url(args)
    if url == tuning.storage_url(args.out / "tuning") and not (args.out / "tuning" / tuning.STUDY_FILE).is_file():
        return args.budget
    study = tuning.open_study(url, spec.name, spec.epochs, args.prune, args.budget, spec.knobs, spec.trial_seeds)
    done = [t for t in tuning.counted_trials(study, args.budget)[0] if t.state.is_finished()]
    return args.budget - len(done)


def print_plan(studies: Studies, args: argparse.Namespace, measured) -> tuple[float, set[str]]:
    """The tuning lines of a dry run; -> (estimated seconds still to run, throughput sources)."""
    seconds, sources = 0.0, set()
    full = pruned = 0.0
    trials = 0
    for spec in studies.values():
        todo = tuning_todo(spec, args)
        probe = load_config(spec.config, list(spec.overrides))
        estimate = gpu_time.estimate_run(probe, measured)
        sources.add(estimate.source)
        trials += todo
        full += todo * estimate.seconds * len(spec.trial_seeds)  # a trial trains once per tuning seed
        pruned += todo * estimate.seconds * tuning.expected_epoch_share(args.budget, spec.epochs)
    seconds += pruned if args.prune else full
    with_prune = (f"~{gpu_time.format_duration(pruned)} with --prune (successive halving, synchronous estimate; "
                  f"{'on' if args.prune else 'off'})") if len(args.tuning_seeds) == 1 else \
        f"{len(args.tuning_seeds)} runs per trial (--tuning-seeds; --prune needs one)"
    print(f"tuning: {len(studies)} studies × {args.budget} trials, {trials} still to run: "
          f"~{gpu_time.format_duration(full)} of device time without pruning, {with_prune}")
    for (dataset, method), spec in studies.items():
        print(f"  tune {dataset}/{method}: {args.budget} trials of " + ", ".join(k.key for k in spec.knobs))
    return seconds, sources


def choose_settings(studies: Studies, args: argparse.Namespace) -> pd.DataFrame:
    """Per (dataset, method): every trial (trials.csv) and the chosen one; refused unless every study is complete."""
    rows, incomplete = [], []
    for (dataset, method), spec in studies.items():
        study = tuning.open_study(study_url(args), spec.name, spec.epochs, args.prune, args.budget, spec.knobs,
                                   spec.trial_seeds)
        outcome = tuning.result(study, args.budget)
        if outcome.unfinished or outcome.best is None:
            incomplete.append(f"{spec.name} ({len(outcome.trials) - len(outcome.unfinished)} of {args.budget} "
                              f"trials finished; see {spec.folder}/worker*.log)")
            continue
        table = pd.DataFrame(tuning.trials_table(spec, outcome))
        atomic_write(spec.folder / "trials.csv", lambda tmp, table=table: table.to_csv(tmp, index=False))
        best = outcome.best
        trained = sum(tuning.epochs_trained(t, spec.epochs) for t in outcome.trials)
        rows.append({"dataset": dataset, "method": method, "settings": best.user_attrs["overrides"],
                     "val_nll": best.value, "at_edge": " ".join(protocol.range_edges(list(spec.knobs), best.params)),
                     "trials": len(outcome.trials), "pruned": sum(t.state.name == "PRUNED" for t in outcome.trials),
                     "epoch_share": trained / (len(outcome.trials) * spec.epochs), "extra_trials": len(outcome.extras),
                     "val_in_sample": protocol.fits_on_validation(load_config(spec.config, list(spec.overrides))),
                     "tuning_seeds": " ".join(map(str, spec.trial_seeds)), "trial": best.user_attrs.get("run", "")})
    if incomplete:
        raise UserError(f"tuning is incomplete for {', '.join(incomplete)}: every method must get its whole budget, "
                        "so nothing was chosen. Fix the cause and run the same command again: it continues there.")
    return pd.DataFrame(rows)
