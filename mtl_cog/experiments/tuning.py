"""The fair protocol's tuning stage as an Optuna study on disk: the same number of trials for every method.

Optuna (Akiba et al., KDD 2019) is the field's standard tuner; we use it as follows.

- **Study on disk.** One SQLite file per protocol folder, ``OUT/tuning/optuna.db``, one study per
  (data set, method) named ``<dataset>-<method>``. ``optuna-dashboard sqlite:///OUT/tuning/optuna.db``
  opens it. Several workers (local processes, Slurm tasks) share a study through that file;
  SQLite needs a file system with working locks (a local disk, most cluster file systems; if
  yours has none, pass a database URL with ``--study-storage``).
- **Space-filling start, then adaptive.** The first ``start_count(budget)`` trials are the
  scrambled Halton points of ``protocol.start_points`` (enqueued once, when the study is new):
  their first coordinate, the follower rate, takes the same values for every method. After them
  ``optuna.samplers.TPESampler`` (Bergstra et al., NeurIPS 2011; seeded, multivariate, with
  the constant liar for parallel workers) proposes the rest.
- **Equal budget.** A study has exactly ``budget`` counted trials: the first ``budget`` trials in
  number order that did not fail. Parallel workers can start a trial or two more than that when
  they ask at the same moment; such extras are recorded (``extra``) but never chosen.
- **Resume.** Every trial trains a run folder ``OUT/tuning/<study>/trial_NN`` that saves its
  state each epoch. A worker that dies stops its heartbeat; the next worker to start marks the
  trial failed and retries it with the same parameters (``RetryHeartbeatStaleTrialCallback``), and the
  retry continues the same run folder. ``NN`` counts first attempts only (``run_numbers``), so a
  retry, which Optuna numbers after the trials asked so far, shifts no later folder: an interrupted
  tuning names the same folders and ``trials.csv`` rows as an uninterrupted one.
- **One search per study.** The study records its knobs and ranges, the epochs per trial,
  pruning and the seeds the trials train with (``check_same_search``); reopening it for another
  search is refused rather than ranking trials of two searches together.
- **Pruning (optional, ``--prune``).** Successive halving (``optuna.pruners.SuccessiveHalvingPruner``,
  Jamieson & Talwalkar 2016; asynchronous, Li et al. 2020) on the validation NLL each epoch
  reports: that of the checkpoint the run keeps so far, the quantity finished trials are ranked
  by (``mtl_cog/cli/tune.py``), with the same rungs for every method (``pruner``). A pruned
  trial counts toward the budget and is never chosen. ``expected_epoch_share`` gives the dry
  run's estimate; the report states the measured share of epochs trained.

A trial's value is the validation NLL (mean over tasks) of its run's best checkpoint, the COG
paper's tuning criterion (App. B), averaged over the trial's runs when it trains with several
seeds (``--tuning-seeds``: one seed's best validation NLL varies by as much as the settings
differ, docs/results/real_images.md); the setting with the lowest value is chosen.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from mtl_cog.config.search_ranges import Knob, ranges_text
from mtl_cog.errors import UserError
from mtl_cog.experiments.halving import RUNG_KEY, HeartbeatRetry, RetryAwareHalving, rung_attrs_of, superseded
from mtl_cog.experiments.protocol import SAMPLER_SEED, TUNE_SEED, start_points
from mtl_cog.experiments.study_storage import check_storage, shown
from mtl_cog.experiments.trial_retries import BY_FIRST_ATTEMPTS, LOST_REASON, NUMBERING_ATTR, RETRY_OF
from mtl_cog.experiments.tuning_rule import LEGACY_RULE, TuningRule, rule_columns

STUDY_FILE = "optuna.db"
HEARTBEAT_SECONDS = 20  # a live trial's worker writes its heartbeat this often (a thread, whatever the epoch length)
GRACE_SECONDS = 90  # a trial silent for this long is dead (a worker killed, a node lost): it is retried
MAX_RETRIES = 3
REDUCTION = 3  # successive halving keeps the best third at each rung
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)

optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours to print


def storage_url(tuning_dir: Path) -> str:
    return f"sqlite:///{(tuning_dir / STUDY_FILE).resolve()}"


def start_count(budget: int) -> int:
    """Space-filling trials before TPE: half the budget, at least 2 (all of a budget of 1-3)."""
    return min(budget, max(2, budget // 2))


def min_resource(epochs: int) -> int:
    """The first rung of successive halving: rungs at r, 3r, 9r, ... epochs, r such that two rungs fit."""
    return max(1, epochs // REDUCTION ** 2)


def pruner(prune: bool, epochs: int, min_trials_per_rung: int = 0) -> optuna.pruners.BasePruner:
    if not prune:
        return optuna.pruners.NopPruner()
    return RetryAwareHalving(min_resource(epochs), REDUCTION, min_trials_per_rung)


def open_study(url: str, name: str, epochs: int, prune: bool, budget: int, knobs: Sequence[Knob],
               trial_seeds: Sequence[int], seed: int = SAMPLER_SEED, rule: TuningRule | None = None,
               pinned: dict[str, float] | None = None) -> optuna.Study:
    """The study ``name`` in ``url`` (created if new), with this protocol's sampler and pruner; every trial
    trains once per seed of ``trial_seeds`` (``--tuning-seeds``), the sampler draws with ``seed``; ``rule``: the
    pruning guard and epoch budget (None: the legacy rule, Optuna's halving and no epoch budget).

    Refused when the storage cannot hold a study (``study_storage.check_storage``, before anything is
    written) or the study was started over another search (``check_same_search``).
    """
    check_storage(url)
    try:
        with warnings.catch_warnings():  # the heartbeat is "experimental" in Optuna since 2.x; we rely on it knowingly
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = HeartbeatRetry(max_retry=MAX_RETRIES, inherit_intermediate_values=True)
            storage = RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS,
                                 heartbeat_stale_trial_callback=retry)
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                    sampler=sampler(seed, budget), load_if_exists=True,
                                    pruner=pruner(prune, epochs, (rule or LEGACY_RULE).min_trials_per_rung))
        if not study.trials and NUMBERING_ATTR not in study.user_attrs:  # new: folders count first attempts
            study.set_user_attr(NUMBERING_ATTR, BY_FIRST_ATTEMPTS)
    except SQLAlchemyError as err:  # what the checks cannot see: a server that refuses, a database gone mid-way
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"study storage {shown(url)} cannot be opened ({cause[:300]}). Check that the database "
                        "is reachable and writable, or use another --study-storage.") from None
    check_same_search(study, url, search_record(knobs, epochs, prune, trial_seeds, rule, pinned))
    return study


def sampler(seed: int, budget: int) -> optuna.samplers.TPESampler:
    """TPE (seeded, multivariate, constant liar for parallel workers) after ``start_count(budget)`` start points.

    A worker re-seeds it before every trial with ``seed + <trials so far>`` (``reseed``), so a proposal
    depends only on the study's history and the seed, not on what the worker's sampler drew before:
    a tuning killed and resumed (or restored from a results bundle) proposes what an uninterrupted one would.
    "Trials so far" leaves out the attempts a retry replaced: each adds a trial to Optuna's count and nothing
    to TPE's history (a failed trial is no observation), and counting them would shift every later seed.
    (Until 2026-12-03 they were counted: a study's proposals after a retry were drawn one seed further per
    attempt lost.) An interrupted start point's retry waits behind the start points still to run, so only the
    order in which successive halving sees them changes.
    """
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=start_count(budget), multivariate=True,
                                      constant_liar=True)


def reseed(study: optuna.Study, seed: int, budget: int) -> None:
    trials = study.get_trials(deepcopy=False)
    study.sampler = sampler(seed + len(trials) - len(superseded(trials)), budget)


SEARCH_ATTR = "search"  # the study's user attribute that records what its trials searched
# What a pruned trial reports after each epoch (mtl_cog/cli/tune.py). Part of the search record: studies
# pruned before this rule (recorded as ``True``) reported each epoch's own NLL, and the pruner must
# not compare the two kinds of report at one rung.
PRUNING_REPORTS = "the kept checkpoint's validation NLL"


def search_record(knobs: Sequence[Knob], epochs: int, prune: bool, trial_seeds: Sequence[int],
                  rule: TuningRule | None = None, pinned: dict[str, float] | None = None) -> dict:
    """What makes two trials comparable: the knobs and their ranges, the epochs per trial, pruning off or what it
    ranks by, the seeds every trial trains with (its value is their mean), and the tuning rule where it is not the
    legacy one (a study recorded before the rule existed reads as the legacy rule), and the values pinned for every
    trial (``pinning``) where there are any."""
    record = {"knobs": [[k.key, k.low, k.high, k.log] for k in knobs], "epochs": epochs,
              "prune": PRUNING_REPORTS if prune else False, "trial_seeds": [int(s) for s in trial_seeds]}
    record |= {} if rule is None or rule == LEGACY_RULE else {"rule": rule.text}
    return record | ({"pinned": {k: float(v) for k, v in sorted(pinned.items())}} if pinned else {})


def check_same_search(study: optuna.Study, url: str, record: dict) -> None:
    """Record the search when the study is new; refuse one whose trials searched something else.

    Why: Optuna lets a resumed study suggest from a changed range, and the choice would then rank
    trials of two different searches together (a protocol folder tuned before the range moved,
    ``--prune`` added or dropped, other epochs) and call the result one study of ``budget`` trials.
    """
    stored = study.user_attrs.get(SEARCH_ATTR)
    if stored is None:  # new (or from before the record existed: nothing to compare with)
        study.set_user_attr(SEARCH_ATTR, record)
        return
    # Recorded before the seeds were: trained with the default; with one seed, recorded as ``trial_seed``.
    stored = {k: v for k, v in stored.items() if k != "trial_seed"} | {
        "trial_seeds": stored.get("trial_seeds", [stored.get("trial_seed", TUNE_SEED)])}
    if stored != record:
        def describe(r: dict) -> str:
            ranges = ", ".join(f"{key} [{low:g}, {high:g}]" for key, low, high, _ in r["knobs"])
            pruning = {False: "off", True: "on each epoch's own validation NLL"}.get(r["prune"], f"on {r['prune']}")
            seeds = " ".join(map(str, r["trial_seeds"]))
            pinned = ", ".join(f"{k}={v:g}" for k, v in r.get("pinned", {}).items())
            return (f"{ranges}; {r['epochs']} epochs; pruning {pruning}; trials trained with seed(s) {seeds}"
                    + (f"; {r['rule']}" if "rule" in r else "") + (f"; pinned {pinned}" if pinned else ""))
        raise UserError(f"{url}: study {study.study_name!r} was tuned over {describe(stored)}, and this run asks "
                        f"for {describe(record)}: its trials are not comparable. Use a new --out (or "
                        "--study-storage), or the settings the study was started with.")


def enqueue_start(study: optuna.Study, knobs: list[Knob], budget: int, seed: int = SAMPLER_SEED,
                  rotation: int | None = None) -> None:
    """Enqueue the Halton start points (scrambled with ``seed``, shifted by ``rotation``'s random shift unless
    None: ``protocol.start_points``), once: a resumed or shared study keeps the ones it has, and is refused when
    they are not these (enqueued with another seed or rule: the draws' seeds changed after it was created, or a
    campaign tuned under the legacy rule is resumed without ``--legacy-tuning``), since every study of a draw
    must start from the same follower rates."""
    points = start_points(knobs, start_count(budget), seed, rotation)
    trials = study.get_trials(deepcopy=False)
    if not trials:
        for point in points:
            study.enqueue_trial(point, skip_if_exists=True)
        return
    for trial, point in zip(sorted(trials, key=lambda t: t.number), points):  # the start points are asked first
        held = trial.params or trial.system_attrs.get("fixed_params", {})
        if any(not math.isclose(float(held.get(key, math.nan)), value, rel_tol=1e-9) for key, value in point.items()):
            raise UserError(f"study {study.study_name!r} starts from {held} as trial {trial.number}, but its sampler "
                            f"seed {seed} starts from {point}" + (" (shifted start points)" if rotation is not None
                                                                  else " (unshifted start points)")
                            + ": it was created under another seed or start rule (a campaign tuned before "
                            "2026-12-04 resumes with --legacy-tuning). Otherwise delete the study "
                            "(optuna.delete_study) and its trial_NN folders, and drop its trials from the results "
                            "bundle, to tune it again.")


def suggest(trial: optuna.Trial, knobs: list[Knob]) -> dict[str, float]:
    """The trial's knob values (enqueued ones are returned as enqueued)."""
    return {k.key: trial.suggest_float(k.key, k.low, k.high, log=k.log) for k in knobs}


def counted_trials(study: optuna.Study, budget: int) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
    """(the budget's trials, extras): the first ``budget`` trials in number order, failed ones included.

    A trial that failed (diverged, refused its setting, crashed) counts toward its method's budget
    and is never chosen: a method gets no extra proposals by failing. Only a trial whose *worker*
    died is not counted: Optuna's heartbeat retries it with the same parameters
    (``RetryHeartbeatStaleTrialCallback`` marks the retry with ``failed_trial``), or a restore from a
    results bundle re-enqueues it (``LOST``); the retry stands in its place.
    """
    trials = study.get_trials(deepcopy=False)
    retried = superseded(trials)
    alive = [t for t in trials if t.state in COUNTED or (t.state == TrialState.FAIL and t.number not in retried)]
    return alive[:budget], alive[budget:]


def remaining(study: optuna.Study, budget: int) -> int:
    return budget - len(counted_trials(study, budget)[0])


def has_work(study: optuna.Study, budget: int, rule: TuningRule = LEGACY_RULE, epochs: int = 0) -> bool:
    """Trials still to ask, or asked-for ones waiting (enqueued start points, retries of dead trials), while the
    study's epoch budget (``rule``) is not spent."""
    trials = counted_trials(study, budget)[0]
    if budget_spent(study, budget, rule, epochs):
        return False
    return len(trials) < budget or any(t.state == TrialState.WAITING for t in trials)


def epochs_so_far(trial: FrozenTrial, epochs: int) -> int:
    """Epochs a counted trial has trained: a running one up to its last report, a waiting one none yet (a retry's
    earlier epochs belong to the attempt it replaces, which is not counted), a finished one ``epochs_trained``."""
    if trial.state == TrialState.RUNNING:
        return max(trial.intermediate_values, default=0)
    return 0 if trial.state == TrialState.WAITING else epochs_trained(trial, epochs)


def epochs_spent(study: optuna.Study, budget: int, epochs: int) -> int:
    """Epochs the budget's trials have trained so far, together."""
    return sum(epochs_so_far(t, epochs) for t in counted_trials(study, budget)[0])


def budget_spent(study: optuna.Study, budget: int, rule: TuningRule, epochs: int) -> bool:
    """Whether the study's epoch budget is spent (never, without one): no trial is asked after that, and a running
    one is stopped (``fair_tuning.pruning_hook``)."""
    return rule.epoch_budget is not None and epochs_spent(study, budget, epochs) >= rule.epoch_budget


def settle_stale(study: optuna.Study, wait: bool = True) -> None:
    """Fail (and so retry) trials whose worker died; with ``wait``, first let a just-killed one go stale.

    A driver resuming after Ctrl-C or a crash finds its previous workers' trials still marked
    running; their heartbeat stops, and after ``GRACE_SECONDS`` they count as dead. Waiting that
    long (once) before launching lets the new workers retry them now instead of a run later.
    """
    import time

    running = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    if running and wait:
        print(f"{study.study_name}: {len(running)} trial(s) marked running from an earlier start; waiting up to "
              f"{GRACE_SECONDS} s for their heartbeat to go stale", flush=True)
        deadline = time.monotonic() + GRACE_SECONDS + HEARTBEAT_SECONDS
        while time.monotonic() < deadline:
            _fail_stale(study)
            if not any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False)):
                return
            time.sleep(5)
    _fail_stale(study)


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9; the heartbeat's own cleanup
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@dataclass
class StudyResult:
    trials: list[FrozenTrial]  # the budget's trials
    extras: list[FrozenTrial]
    best: FrozenTrial | None  # lowest value among the complete ones
    unfinished: list[FrozenTrial]  # running or waiting: the tuning is not over
    uncounted: list[FrozenTrial]  # failed because their worker died; retried in their place


def result(study: optuna.Study, budget: int, rule: TuningRule = LEGACY_RULE, epochs: int = 0) -> StudyResult:
    """The study's outcome; with its epoch budget spent, the trials never asked (or waiting) are no unfinished
    work: the budget ended the study."""
    trials, extras = counted_trials(study, budget)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
    best = min(complete, key=lambda t: (t.value, t.number)) if complete else None
    spent = budget_spent(study, budget, rule, epochs)
    unfinished = [t for t in trials if t.state == TrialState.RUNNING or t.state == TrialState.WAITING and not spent]
    if len(trials) < budget and not spent:
        unfinished += [None] * (budget - len(trials))  # type: ignore[list-item]  (never asked)
    listed = {t.number for t in [*trials, *extras]}
    uncounted = [t for t in study.get_trials(deepcopy=False) if t.number not in listed and t.state.is_finished()]
    return StudyResult(trials, extras, best, unfinished, uncounted)


def epochs_trained(trial: FrozenTrial, epochs: int) -> int:
    """Epochs a trial trained: all of them when complete, up to its last report when pruned or failed (a trial
    restored from a results bundle has no reports: the bundle's count, ``EPOCHS_ATTR``)."""
    if trial.state in (TrialState.PRUNED, TrialState.FAIL):
        return max(trial.intermediate_values, default=int(trial.user_attrs.get(EPOCHS_ATTR, 0)))
    return epochs


# Successive halving decides at each rung by comparing the trial's value with every earlier trial's value at
# that rung, which Optuna keeps in the trials' system attributes ``completed_rung_<k>``. trials.csv carries
# them (``rung_values``: one float per rung reached, in rung order) so that a study restored from a results
# bundle on another machine prunes its remaining trials against the same competitors as an uninterrupted one.
EPOCHS_ATTR = "epochs_trained"


def rung_values(trial: FrozenTrial) -> str:
    """The trial's values at the rungs it completed, ``repr`` floats separated by spaces ('' when none)."""
    return " ".join(repr(float(value)) for value in rung_attrs_of(trial).values())


def rung_attrs(text: object) -> dict[str, float]:
    """``rung_values`` read back as system attributes (an empty or missing cell: none; a column whose cells all
    hold one value is read by pandas as numbers)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return {} if math.isnan(text) else {RUNG_KEY.format(0): float(text)}
    if not isinstance(text, str) or not text.strip():
        return {}
    return {RUNG_KEY.format(k): float(v) for k, v in enumerate(text.split())}


def expected_epoch_share(budget: int, epochs: int, rule: TuningRule = LEGACY_RULE) -> float:
    """Share of ``budget x epochs`` that successive halving trains, in its synchronous idealisation; under a
    ``rule`` that judges trials against every start point those run whole first, and an epoch budget caps it.

    Rungs at r, 3r, 9r, ... (``min_resource``); a third of the trials reaching a rung go on to the
    next. The asynchronous variant Optuna runs promotes the first trials at each rung
    unconditionally, so with few trials it prunes less: the report measures the real share.
    """
    r = min_resource(epochs)
    rungs = []
    while r < epochs:
        rungs.append(r)
        r *= REDUCTION
    if budget < 1 or not rungs:
        return 1.0
    total, alive, trained = 0.0, float(budget), 0
    for rung in rungs:
        total += alive * (rung - trained)
        trained = rung
        alive = max(1.0, alive / REDUCTION)
    total += alive * (epochs - trained)
    share = total / (budget * epochs)
    if rule.min_trials_per_rung >= start_count(budget):  # the start points unpruned, the rest halved
        starts = start_count(budget) / budget
        share = starts + (1 - starts) * share
    return share if rule.epoch_budget is None else min(share, rule.epoch_budget / (budget * epochs))


def check_processes(processes: int) -> None:
    if processes > 1:
        raise UserError("the fair protocol's tuning trains each trial inside an Optuna worker, one process per "
                        "trial: use --gpus-per-run 1 for it (the final runs can then use more).")


@dataclass(frozen=True)
class StudySpec:
    """One (data set, method) study of a fair protocol: what its workers train."""

    dataset: str
    method: str
    config: tuple[Path, ...]  # config files, merged in order
    overrides: tuple[str, ...]  # the protocol's (scale, seed, output folder = the study's folder)
    base_follower_lr: float
    knobs: tuple[Knob, ...]
    epochs: int
    folder: Path
    trial_seeds: tuple[int, ...]  # every trial trains once per seed; its value is the mean (experiments/fair_tuning.py)
    draw: str = "1"  # the tuning draw: another draw has other trial seeds and another sampler seed
    sampler_seed: int = SAMPLER_SEED
    widening: int = 0  # re-tunings over widened ranges after a choice sat at a range edge (fair_tuning.widen)
    rotate: bool = False  # shift the start points at random (independent draws); False: the legacy rule
    rule: TuningRule = LEGACY_RULE  # the pruning guard and epoch budget (study_rules.recorded_rules)
    pinned: tuple[tuple[str, float], ...] = ()  # settings every trial holds, not tuned (pinning, --pin-to)

    @property
    def rotation(self) -> int | None:
        """The start points' random shift (``protocol.start_points``): one per draw and re-tuning; None: none."""
        return self.widening if self.rotate else None

    @property
    def name(self) -> str:
        return (f"{self.dataset}-{self.method}" + ("" if self.draw == "1" else f"-d{self.draw}")
                + ("" if not self.widening else f"-w{self.widening}"))


def trials_table(spec: StudySpec, outcome: StudyResult) -> list[dict]:
    """trials.csv: every trial of the study (the budget's and the extras), its settings, value, epochs, choice."""
    rows = []
    for trial in sorted([*outcome.trials, *outcome.extras, *outcome.uncounted], key=lambda t: t.number):
        rows.append({"trial": trial.number, "run": trial.user_attrs.get("run", ""), "state": trial.state.name.lower(),
                     "counted": trial in outcome.trials, "draw": spec.draw,
                     # a waiting trial (an enqueued start point, a retry) has its parameters only as fixed_params
                     **dict(trial.params or trial.system_attrs.get("fixed_params", {})),
                     RETRY_OF: trial.user_attrs.get(RETRY_OF, trial.system_attrs.get("failed_trial", "")),
                     "overrides": trial.user_attrs.get("overrides", ""),
                     "reason": trial.user_attrs.get("reason", "") or (
                         LOST_REASON if trial in outcome.uncounted
                         else ""),
                     "val_nll": trial.value if trial.state == TrialState.COMPLETE else math.nan,
                     "epochs_trained": epochs_so_far(trial, spec.epochs),  # a waiting trial: none yet
                     "rung_values": rung_values(trial),
                     "ranges": ranges_text(list(spec.knobs)),  # the study's search space: edges checkable
                     **rule_columns(spec.rule),
                     # chosen only once the study holds its whole budget: before, the best so far is no choice
                     "chosen": "*" if outcome.best is not None and not outcome.unfinished
                     and trial.number == outcome.best.number else ""})
    return rows
