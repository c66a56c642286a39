"""The fair protocol's tuning stage: its Optuna studies as campaign specs, their workers, plan and choice.

``reproduce --protocol fair`` builds one ``tuning.StudySpec`` per (data set, method, tuning draw) and
calls ``run_workers`` (start workers, locally or on Slurm, until every study holds ``--budget``
trials), ``choose_settings`` (the chosen setting per study; refused while a study is incomplete) and
``print_plan`` (the dry run's tuning lines, with and without pruning). A worker
(``python -m mtl_cog.cli.tune``, i.e. ``work``) trains trials in its own process, so successive
halving can stop one between epochs; every trial run is a campaign spec (role ``trial``) recorded in
the campaign's results bundle as it ends, and the study's ``trials.csv`` there is rewritten after
every trial, failed and pruned ones included.

**Draws.** ``--draws N`` tunes every method N times, independently: draw ``d`` trains its trials
with the tuning seeds shifted by ``DRAW_SEED_STEP x (d - 1)`` and samples with sampler seed
``protocol.sampler_seed(d)`` (another Halton scramble, a TPE stream that never meets another draw's).
A verdict that two draws disagree on depends on the tuning draw, not on the method
(``mtl_cog/reporting/bundle_report.py``).

**Resume from a bundle.** The studies live in ``OUT/tuning/optuna.db``; on a fresh clone that file
is gone but the bundle's ``trials.csv`` is not: ``restore_study`` re-adds every recorded trial
(parameters, value, state, runs) in number order, and re-enqueues those whose worker died, so the
tuning continues where the bundle stopped, and the trials recorded there are not trained again.
The sampler is re-seeded before each trial from the trial count (``tuning.reseed``): a restored
study proposes what the uninterrupted one would have (with one worker per study; parallel
workers make TPE's proposals depend on timing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import optuna
import pandas as pd
from filelock import FileLock
from optuna.trial import TrialState

from mtl_cog.bundles import bundle as bundles
from mtl_cog.bundles.trajectories import read_metrics_lines
from mtl_cog.config import Config, load_config, search_ranges
from mtl_cog.errors import UserError
from mtl_cog.experiments import campaign, gpu_time, halving, protocol, trial_retries, tuning
from mtl_cog.experiments.launcher import LocalLauncher, RunJob, python_module_command
from mtl_cog.experiments.sweep import DONE, UNFINISHED, run_state, validation_scores
from mtl_cog.experiments.tuning_rule import TuningRule
from mtl_cog.io import output_folder
from mtl_cog.runs import rundir
from mtl_cog.training import fit
from mtl_cog.training.loop import EpochEnd, Hooks

Studies = dict[tuple[str, str, str], tuning.StudySpec]  # (data, method, draw) -> study
DRAW_SEED_STEP = 100  # draw d trains its trials with the tuning seeds + 100 (d - 1)


def draw_seeds(tuning_seeds: list[int], draw: int) -> tuple[int, ...]:
    return tuple(s + DRAW_SEED_STEP * (draw - 1) for s in tuning_seeds)


def study_url(args: argparse.Namespace) -> str:
    return args.study_storage or tuning.storage_url(args.out / "tuning")


def open_spec(spec: tuning.StudySpec, url: str, budget: int, prune: bool) -> optuna.Study:
    return tuning.open_study(url, spec.name, spec.epochs, prune, budget, spec.knobs, spec.trial_seeds,
                             spec.sampler_seed, spec.rule, dict(spec.pinned))


# ------------------------------------------------------------------------------------------ driver side


def run_workers(studies: Studies, args: argparse.Namespace, runner, env: tuple[tuple[str, str], ...],
                campaign_name: str) -> None:
    """Start the studies' workers with ``runner`` (local or Slurm) until every study holds its budget."""
    output_folder(args.out / "tuning", "--out")
    workers = args.tune_workers or ((args.parallel or 2) if isinstance(runner, LocalLauncher) else 4)
    recorded = bundles.read_bundle(bundles.bundle_dir(args.out))
    jobs, complete = [], 0
    for spec in studies.values():
        study = open_spec(spec, study_url(args), args.budget, args.prune)
        restore_study(study, spec, recorded)
        tuning.enqueue_start(study, list(spec.knobs), args.budget, spec.sampler_seed, spec.rotation)
        tuning.settle_stale(study)
        if not tuning.has_work(study, args.budget, spec.rule, spec.epochs):
            complete += 1
            continue
        command = python_module_command("mtl_cog.cli.tune", worker_args(spec, study_url(args), args, campaign_name))
        jobs += [RunJob(f"{spec.name}/worker{i}", tuple(command), spec.folder / f"worker{i}.log", env=env)
                 for i in range(min(workers, args.budget))]
        output_folder(spec.folder, "--out")
    print(f"tuning: {len(studies)} studies of {args.budget} trials, {complete} already complete, "
          f"{len(jobs)} worker(s) to run", flush=True)
    if not jobs:
        return
    try:
        runner.run(jobs)
    except KeyboardInterrupt:
        raise campaign.interrupted(f"the same command (--out {args.out})") from None


def worker_args(spec: tuning.StudySpec, url: str, args: argparse.Namespace, campaign_name: str) -> list[str]:
    """``mtl_cog.cli.tune``'s arguments for a worker of ``spec``."""
    return ["--storage", url, "--study", spec.name, "--config", *map(str, spec.config), "--base-follower-lr",
            repr(spec.base_follower_lr), "--budget", str(args.budget), *(["--prune"] if args.prune else []),
            "--trial-seeds", *map(str, spec.trial_seeds), "--draw", spec.draw, "--sampler-seed",
            str(spec.sampler_seed), "--data", spec.dataset, "--method", spec.method, "--campaign", campaign_name,
            "--bundle-out", str(args.out), "--widening", str(spec.widening), *(["--rotate"] if spec.rotate else []),
            "--knobs", json.dumps([[k.key, k.low, k.high, k.log] for k in spec.knobs]),
            "--min-trials-per-rung", str(spec.rule.min_trials_per_rung),
            *(["--pinned", json.dumps(dict(spec.pinned))] if spec.pinned else []),
            *(["--epoch-budget", str(spec.rule.epoch_budget)] if spec.rule.epoch_budget else []), "--", *spec.overrides]


def restore_study(study: optuna.Study, spec: tuning.StudySpec, recorded: bundles.Bundle | None) -> int:
    """Re-add the trials the bundle records for ``spec`` to a study that lacks them (a fresh clone: the
    study file was lost with its machine); -> how many were added."""
    if recorded is None or recorded.trials.empty or "study" not in recorded.trials:
        return 0
    rows = recorded.trials[recorded.trials["study"] == spec.name].sort_values("trial")
    present = len(study.get_trials(deepcopy=False))
    if len(rows) <= present:
        return 0
    distributions = {k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in spec.knobs}
    for row in rows.iloc[present:].to_dict("records"):
        try:
            params = {k: float(row[k]) for k in distributions}
        except (KeyError, TypeError, ValueError):
            params = {}
        if len(params) != len(distributions) or not all(math.isfinite(v) for v in params.values()):
            raise UserError(f"the results bundle's {bundles.TRIALS}: trial {row.get('trial')} of study {spec.name} "
                            f"lacks its parameters ({', '.join(distributions)}); restore the file from git.")
        retry_of = row.get(trial_retries.RETRY_OF)
        retry_attrs = {} if retry_of is None or pd.isna(retry_of) or retry_of == "" else {
            trial_retries.RETRY_OF: int(retry_of)}
        if row["state"] in ("running", "waiting"):  # asked, not finished: asked again, with the rungs it passed
            first = retry_attrs.get(trial_retries.RETRY_OF, int(row["trial"]) if row["state"] == "running" else None)
            trial_retries.enqueue_retry(study, params, first, tuning.rung_attrs(row.get("rung_values")))
            continue
        reason = row.get("reason")
        attrs = {"overrides": row["overrides"], "run": row["run"],
                 "reason": "" if reason is None or pd.isna(reason) else str(reason), **retry_attrs}
        state = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(row["state"], TrialState.FAIL)
        # its worker died: retried in its place, not counted (an extra trial of parallel workers, also not counted,
        # has a reason of its own and stays what it was: a failed extra is no lost one)
        lost = str(row.get("counted", True)) == "False" and attrs["reason"] in ("", trial_retries.LOST_REASON)
        value = float(row["val_nll"]) if state == TrialState.COMPLETE else None
        epochs = row.get("epochs_trained")
        if epochs is not None and not pd.isna(epochs):
            attrs[tuning.EPOCHS_ATTR] = int(epochs)
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=distributions, value=value, state=state,
            user_attrs={**attrs, **({halving.LOST: True} if lost else {})},
            system_attrs=tuning.rung_attrs(row.get("rung_values"))))
    return len(rows) - present


def tuning_todo(spec: tuning.StudySpec, args: argparse.Namespace) -> int:
    """Trials of ``spec`` not yet finished, read without writing anything (a dry run creates no study and records
    no search): the study's finished trials where it exists, else the bundle's, else the whole budget."""
    url = study_url(args)
    recorded = bundles.read_bundle(bundles.bundle_dir(args.out))
    in_bundle = 0
    if recorded is not None and "study" in recorded.trials:
        rows = recorded.trials[recorded.trials["study"] == spec.name]
        counted = rows[rows["counted"].astype(str) == "True"] if "counted" in rows else rows
        in_bundle = int(counted["state"].isin(["complete", "pruned", "fail"]).sum())
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return max(0, args.budget - in_bundle)
    try:
        if spec.name not in optuna.study.get_all_study_names(storage=url):
            return max(0, args.budget - in_bundle)
        study = optuna.load_study(study_name=spec.name, storage=url)
    except Exception as err:  # noqa: BLE001  (a storage Optuna cannot read: the real run refuses it in one line)
        raise UserError(f"--study-storage {url}: cannot be read ({type(err).__name__}).") from None
    done = [t for t in tuning.counted_trials(study, args.budget)[0] if t.state.is_finished()]
    return max(0, args.budget - max(len(done), in_bundle))


def print_plan(studies: Studies, args: argparse.Namespace, measured) -> tuple[tuple[float, float], tuple[float, float]]:
    """The tuning lines of a dry run; -> ((device, cpu) seconds still to run without pruning, the same with the
    pruning this run uses: with ``--prune`` the synchronous estimate, else the same as without)."""
    full, pruned = [0.0, 0.0], [0.0, 0.0]
    trials = 0
    for spec in studies.values():
        todo = tuning_todo(spec, args)
        estimate = gpu_time.estimate_run(load_config(list(spec.config), list(spec.overrides)), measured)
        trials += todo
        full[estimate.on_cpu] += todo * estimate.seconds * len(spec.trial_seeds)  # a trial trains once per seed
        pruned[estimate.on_cpu] += todo * estimate.seconds * tuning.expected_epoch_share(args.budget, spec.epochs,
                                                                                        spec.rule)
    with_prune = (f"~{gpu_time.format_duration(sum(pruned))} with --prune (successive halving, synchronous "
                  f"estimate; {'on' if args.prune else 'off'})") if len(args.tuning_seeds) == 1 else \
        f"{len(args.tuning_seeds)} runs per trial (--tuning-seeds; --prune needs one)"
    print(f"tuning: {len(studies)} studies × {args.budget} trials, {trials} still to run: "
          f"~{gpu_time.format_duration(sum(full))} of device time without pruning, {with_prune}")
    for spec in studies.values():
        ranges = ", ".join([f"{k.key} [{k.low:g}, {k.high:g}]" for k in spec.knobs]
                           + [f"{key} pinned at {value:g}" for key, value in spec.pinned])
        print(f"  tune {spec.dataset}/{spec.method}" + ("" if spec.draw == "1" else f" (draw {spec.draw})")
              + f": {args.budget} trials of {ranges}")
    used = pruned if args.prune and len(args.tuning_seeds) == 1 else full
    return (full[0], full[1]), (used[0], used[1])


def choose_settings(studies: Studies, args: argparse.Namespace) -> pd.DataFrame:
    """Per study: the chosen trial (every trial goes to the bundle's trials.csv); refused while one is incomplete."""
    rows, incomplete = [], []
    for (dataset, method, draw), spec in studies.items():
        study = open_spec(spec, study_url(args), args.budget, args.prune)
        outcome = tuning.result(study, args.budget, spec.rule, spec.epochs)
        if outcome.unfinished or outcome.best is None:
            finished = sum(t is not None and t.state.is_finished() for t in outcome.trials)
            incomplete.append(f"{spec.name} ({finished} of {args.budget} trials finished; see "
                              f"{spec.folder}/worker*.log)")
            continue
        table = pd.DataFrame(tuning.trials_table(spec, outcome))
        bundles_trials(args.out, spec.name, table)
        best = outcome.best
        trained = sum(tuning.epochs_trained(t, spec.epochs) for t in outcome.trials)
        rows.append({"dataset": dataset, "method": method, "draw": draw, "settings": best.user_attrs["overrides"],
                     "val_nll": best.value, "at_edge": " ".join(protocol.range_edges(list(spec.knobs), best.params)),
                     "ranges": search_ranges.ranges_text(list(spec.knobs)),
                     "widened": spec.widening,
                     "trials": len(outcome.trials), "failed": sum(t.state == TrialState.FAIL for t in outcome.trials),
                     "pruned": sum(t.state == TrialState.PRUNED for t in outcome.trials),
                     "epoch_share": trained / (len(outcome.trials) * spec.epochs), "extra_trials": len(outcome.extras),
                     "epochs_trained": trained, "unopposed": unopposed(outcome), "rule": spec.rule.text,
                     "val_in_sample": protocol.fits_on_validation(load_config(list(spec.config), list(spec.overrides))),
                     "tuning_seeds": " ".join(map(str, spec.trial_seeds)), "trial": best.user_attrs.get("run", "")})
    if incomplete:
        raise UserError(f"tuning is incomplete for {', '.join(incomplete)}: every method must get its whole budget, "
                        "so nothing was chosen. Fix the cause and run the same command again: it continues there.")
    return pd.DataFrame(rows)


def unopposed(outcome: tuning.StudyResult) -> bool:
    """Whether the study's choice is its first trial and no other trial finished: a choice nothing competed with
    (under the legacy rule, the first start point promoted at every rung and the others pruned against it)."""
    first = min(outcome.trials, key=lambda t: t.number)
    return outcome.best is not None and outcome.best.number == first.number and not any(
        t.state == TrialState.COMPLETE for t in outcome.trials if t.number != first.number)


def bundles_trials(out: Path, study: str, table: pd.DataFrame) -> None:
    """Write ``study``'s trials into the bundle of the campaign in ``out`` (it exists once a trial ran)."""
    folder = bundles.bundle_dir(out)
    with FileLock(str(Path(out) / "bundle.lock")):
        bundle = bundles.read_bundle(folder)
        if bundle is None:
            return
        bundle.set_trials(study, table)
        bundles.write_bundle(folder, bundle)


# ------------------------------------------------------------------------------------------ worker side


def pruning_hook(trial: optuna.Trial, run_dir: Path, prune: bool, budget_spent=lambda: False) -> Hooks:
    """After each stage-one epoch, report the validation NLL the trial would score if it stopped now;
    stop the run when successive halving says so (``prune``) or the study's epoch budget is spent
    (``budget_spent()``, ``tuning_rule``).

    That is the NLL of the checkpoint the run keeps (chosen on validation Brier), the number the
    study ranks finished trials by, not the epoch's own NLL: at a rung the pruner then compares what
    each trial has *earned*, and one noisy epoch after a good checkpoint does not end a trial whose
    kept checkpoint is among the best (on fashion_mnist a COG-FC trial was pruned at epoch 9 of 10
    on a spike, 0.718, above its kept 0.648).
    """
    def on_epoch_end(end: EpochEnd) -> None:
        if end.stage != "stage_one":
            return
        trial.report(kept_checkpoint_nll(end, run_dir), end.epoch)
        if prune and trial.should_prune():
            raise optuna.TrialPruned(f"pruned after epoch {end.epoch}")
        if budget_spent():
            raise optuna.TrialPruned(f"stopped after epoch {end.epoch}: the study's epoch budget is spent")
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


def trial_runs(folder: Path, number: int, seeds: list[int]) -> list[tuple[int, Path]]:
    """(seed, run folder) of trial ``number``: ``trial_NN`` with one seed, ``trial_NN-seed<S>`` with several."""
    if len(seeds) == 1:
        return [(seeds[0], folder / campaign.run_name(trial=number))]
    return [(s, folder / campaign.run_name(trial=number, seed=s)) for s in seeds]


def parse_worker_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mtl_cog.cli.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", required=True, help="Optuna storage URL (sqlite:///.../optuna.db)")
    parser.add_argument("--study", required=True, help="study name, <dataset>-<method>[-d<draw>]")
    parser.add_argument("--config", type=Path, nargs="+", required=True, help="config files, merged in order")
    parser.add_argument("--base-follower-lr", type=float, required=True, help="f0, the centre of the rate range")
    parser.add_argument("--budget", type=int, required=True, help="trials of the study (every method the same)")
    parser.add_argument("--prune", action="store_true", help="successive halving on the per-epoch validation NLL")
    parser.add_argument("--trial-seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="train every trial once per seed, its value the mean (default: the config's seed)")
    parser.add_argument("--draw", default="1", help="the tuning draw (a label in the bundle)")
    parser.add_argument("--sampler-seed", type=int, default=protocol.SAMPLER_SEED)
    parser.add_argument("--data", default="", help="the data set's name (a label in the bundle)")
    parser.add_argument("--method", default="", help="the method's name (a label in the bundle)")
    parser.add_argument("--campaign", default="", help="the campaign whose bundle records the trials")
    parser.add_argument("--bundle-out", type=Path, default=None, help="the campaign's --out (its bundle/)")
    parser.add_argument("--widening", type=int, default=0, help="re-tunings over widened ranges (a label)")
    parser.add_argument("--rotate", action="store_true",
                        help="shift the start points at random, one shift per draw and re-tuning (independent draws)")
    parser.add_argument("--knobs", default=None, help="JSON [[key, low, high, log], ...]: the study's ranges "
                        "(default: the protocol's search space; a widened study passes its own)")
    parser.add_argument("--min-trials-per-rung", type=int, default=0,
                        help="successive halving judges a trial at a rung against at least this many others")
    parser.add_argument("--epoch-budget", type=int, default=None, help="epochs the study's trials train together")
    parser.add_argument("--pinned", default=None, help="JSON {key: value}: settings every trial holds (--pin-to)")
    parser.add_argument("overrides", nargs="*", help="the protocol's overrides (after --)")
    return parser.parse_args(argv)


def work(argv: list[str] | None = None) -> int:
    """A tuning worker: trains trials of one study until it holds its budget; exit 0 when it does."""
    args = parse_worker_args(argv)
    base = load_config(args.config, args.overrides)
    knobs = [protocol.Knob(key, low, high, log) for key, low, high, log in json.loads(args.knobs)] if args.knobs \
        else protocol.search_space(base, args.base_follower_lr)
    folder = Path(base.output_dir)
    seeds = args.trial_seeds or [base.seed]
    if args.prune and len(seeds) > 1:  # the pruner would see one seed's epochs and rank the mean of several
        raise UserError(f"--prune with {len(seeds)} tuning seeds: successive halving stops a trial on one run's "
                        "epochs, while its value is the mean over seeds. Use one tuning seed, or no --prune.")
    rule = TuningRule(args.min_trials_per_rung, args.epoch_budget)
    pinned = {key: float(value) for key, value in json.loads(args.pinned).items()} if args.pinned else {}
    study = tuning.open_study(args.storage, args.study, base.train.epochs, args.prune, args.budget, knobs, seeds,
                              args.sampler_seed, rule, pinned)
    spec = tuning.StudySpec(args.data, args.method, tuple(args.config), tuple(args.overrides), args.base_follower_lr,
                            tuple(knobs), base.train.epochs, folder, tuple(seeds), args.draw, args.sampler_seed,
                            args.widening, args.rotate, rule, tuple(sorted(pinned.items())))
    tuning.enqueue_start(study, knobs, args.budget, args.sampler_seed, spec.rotation)

    def trial_specs(trial: optuna.Trial, setting: dict[str, float]) -> list[tuple[campaign.RunSpec, Config]]:
        number = trial_retries.run_number(trial)
        out = []
        for seed, run_dir in trial_runs(folder, number, seeds):
            overrides = (*args.overrides, f"seed={seed}", *protocol.as_overrides(setting))
            labels = campaign.Labels(args.data, args.method, "trial", seed, args.draw, f"{number:02d}")
            spec_ = campaign.RunSpec(f"{args.study}-{run_dir.name}", tuple(args.config), overrides, run_dir, labels)
            out.append((spec_, load_config(list(spec_.configs), spec_.all_overrides())))
        return out

    def record(specs: list[tuple[campaign.RunSpec, Config]], status: str = "", reason: str = "") -> None:
        if args.bundle_out is None:
            return
        planned = [campaign.Planned(s, c, campaign.config_digest(c), DONE) for s, c in specs]
        driver_campaign = campaign.Campaign(args.campaign, args.bundle_out, [s for s, _ in specs], command=[])
        collector = campaign.Collector(driver_campaign, planned)
        if status:
            collector.update(lambda b: [b.add_run(collector.unfinished_row(p, status, reason),
                                                  pd.DataFrame(columns=bundles.RESULT_COLUMNS),
                                                  pd.DataFrame(columns=bundles.CURVE_COLUMNS)) for p in planned
                                        if not (p.spec.run_dir / rundir.DONE).is_file()])
        collector.collect([p.spec.run for p in planned])

    def spent() -> bool:
        return tuning.budget_spent(study, args.budget, rule, base.train.epochs)

    def objective(trial: optuna.Trial) -> float:
        setting = protocol.resolve({**pinned, **tuning.suggest(trial, knobs)})
        specs = trial_specs(trial, setting)
        trial.set_user_attr("overrides", " ".join(protocol.as_overrides(setting)))
        trial.set_user_attr("run", " ".join(s.run_dir.name for s, _ in specs))
        nlls = []
        try:
            for spec_, cfg in specs:
                state = run_state(spec_.run_dir, cfg)
                print(f"{args.study} trial {trial.number} ({spec_.run_dir.name}): "
                      f"{' '.join(protocol.as_overrides(setting))}"
                      + {DONE: ", already trained", UNFINISHED: ", continues its run"}.get(state, ""), flush=True)
                if state != DONE:
                    fit(cfg, resume_dir=spec_.run_dir if state == UNFINISHED else None,
                        hooks=pruning_hook(trial, spec_.run_dir, args.prune, spent) if args.prune or
                        rule.epoch_budget else None)
                nlls.append(validation_nll(spec_.run_dir, cfg))
        except KeyboardInterrupt:  # the worker is stopped, not the trial failed: asked again, not counted
            trial_retries.retry_lost(trial)
            raise
        except optuna.TrialPruned as pruned:
            trial.set_user_attr("reason", str(pruned))
            record(specs, "pruned", str(pruned))
            raise
        except (UserError, RuntimeError, ValueError, FloatingPointError) as err:  # the trial failed, not the worker
            reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
            trial.set_user_attr("reason", reason)
            print(f"{args.study} trial {trial.number} failed: {reason}", file=sys.stderr, flush=True)
            record(specs, "failed", reason)
            return math.nan  # Optuna records it as failed; it counts toward the budget
        value = sum(nlls) / len(nlls)
        if not math.isfinite(value):
            trial.set_user_attr("reason", "validation NLL not finite")
        try:
            record(specs)
        except (UserError, OSError):  # the bundle could not take it: the worker stops, the trial is asked again
            trial_retries.retry_lost(trial)
            raise
        return value

    def write_trials() -> None:
        """The study's rows of trials.csv, written after Optuna stored each trial's end (record() runs inside the
        trial, where the trial still reads "running")."""
        if args.bundle_out is not None:
            outcome = tuning.result(study, args.budget, rule, spec.epochs)
            bundles_trials(args.bundle_out, args.study, pd.DataFrame(tuning.trials_table(spec, outcome)))

    write_trials()  # a restored or already finished study: its rows as they stand
    while tuning.has_work(study, args.budget, rule, spec.epochs):
        tuning.reseed(study, args.sampler_seed, args.budget)
        study.optimize(objective, n_trials=1)
        write_trials()
    return 0


def validation_nll(run_dir: Path, cfg: Config) -> float:
    """The task-mean validation NLL of a finished run's selected checkpoint (digests checked)."""
    return validation_scores(run_dir, cfg.eval.bins)["nll"]
