"""A tuning trial's identity across retries: which first attempt it retries, and the ``trial_NN`` folder it trains.

A worker stopped mid-trial asks for the trial again with the same parameters (``retry_lost``); Optuna's heartbeat
does the same for a worker that died. The retry continues the same run folder and inherits the rungs its first
attempt completed (``mtl_cog.experiments.halving``). Split from ``tuning.py``, which re-exports these names.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from mtl_cog.experiments.halving import LOST, rung_attrs_of


def first_attempt(trial: FrozenTrial | optuna.Trial) -> int:
    """The number of the trial this one retries (itself if none)."""
    if not isinstance(trial, FrozenTrial):
        trial = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
    retried = trial.system_attrs.get("failed_trial")  # RetryHeartbeatStaleTrialCallback's mark: the first attempt
    retried = trial.user_attrs.get(RETRY_OF, retried)  # an interrupted worker's (``retry_lost``)
    return trial.number if retried is None else retried


RETRY_OF = "retry_of"


def retry_lost(trial: optuna.Trial) -> None:
    """The worker running ``trial`` is being stopped (Ctrl-C, a campaign interrupted): Optuna will mark the trial
    failed, which must not count against the method. Mark it ``LOST`` and ask for it again with the same
    parameters; the retry continues the same run folder (``first_attempt``) and the rungs it completed."""
    trial.set_user_attr(LOST, True)
    frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
    enqueue_retry(trial.study, trial.params, first_attempt(frozen), rung_attrs_of(frozen))


LOST_REASON = "its worker stopped; asked again with the same parameters"  # trials.csv's reason of a LOST trial


def enqueue_retry(study: optuna.Study, params: dict[str, float], retry_of: int | None,
                  rungs: dict[str, float]) -> None:
    """Ask for a trial with ``params`` (Optuna's ``enqueue_trial``), retrying ``retry_of`` (None: a first
    attempt) and holding the ``rungs`` its run has completed: it continues that run, and successive halving must
    not judge it there again on a later epoch's value (``mtl_cog.experiments.halving``)."""
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": params, **rungs},
                                              user_attrs={} if retry_of is None else {RETRY_OF: retry_of}))


# How a study numbers its trial_NN folders (a user attribute set when the study is created). Studies
# from before it keep what they started with, the first attempt's trial number, so that their
# folders keep their names when they are resumed.
NUMBERING_ATTR = "run_numbers"
BY_FIRST_ATTEMPTS = "first attempts in order"


def run_numbers(study: optuna.Study) -> dict[int, int]:
    """Optuna's trial number -> the NN of the trial's run folder ``trial_NN``.

    NN is the trial's place among the study's first attempts (trials that retry none: neither a
    dead trial's heartbeat retry nor ``retry_lost``'s), a retry taking its first attempt's: what an
    uninterrupted tuning numbers them. Optuna numbers a retry after every trial asked so far, so
    numbering folders by Optuna's numbers would shift every later folder once a worker was killed.
    The first attempts before a trial exist when it is asked, so its NN never changes.
    """
    trials = study.get_trials(deepcopy=False)
    if study.user_attrs.get(NUMBERING_ATTR) != BY_FIRST_ATTEMPTS:
        return {t.number: first_attempt(t) for t in trials}
    firsts = sorted(t.number for t in trials if first_attempt(t) == t.number)
    place = {number: i for i, number in enumerate(firsts)}
    return {t.number: place[first_attempt(t)] for t in trials}


def run_number(trial: optuna.Trial) -> int:
    """The NN of ``trial``'s run folder ``trial_NN`` (``run_numbers``)."""
    return run_numbers(trial.study)[trial.number]
