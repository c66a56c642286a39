"""Successive halving that judges a trial interrupted mid-run once, at the rungs it really reached; one retry each.

Optuna's ``SuccessiveHalvingPruner`` records, at each rung a trial reaches, its latest reported value
(``completed_rung_<k>``) and compares it with every trial's value at that rung. A trial whose worker is
stopped is asked again with the same parameters and continues its run folder from the last saved epoch
(``tuning.retry_lost``, or Optuna's heartbeat retry). Left to Optuna, two things then go wrong:

- The retry is a new trial with no rung of its own. Its first report comes at the epoch it resumes at, so
  the pruner records *that* value at every earlier rung: a value reached at epoch 8 stands at the 2-epoch
  rung among the others' 2-epoch values. It is better than anything there, and the trials asked after it
  are pruned against a value no trial earned at that rung (measured: in ``fashion_mnist``'s widened draw-2
  LS study, the trial with the best value any trial earned at 2 epochs was pruned there against a retry's
  epoch-19 value). The retry must *inherit* the rungs its first attempt completed (``rung_attrs_of``), as the
  heartbeat retry does when it copies the trial's system attributes.
- The interrupted attempt keeps its rung values, and the retry holds the same ones: one run counted twice
  at each rung. ``RetryAwareHalving`` leaves the attempts retried in their place (``superseded``) out of
  the competitors.

With both, an interrupted tuning prunes as an uninterrupted one would.

**No trial wins unopposed** (``min_trials_per_rung``, ``tuning_rule``). Asynchronous halving judges a trial at a
rung against the trials that reached it before; the first trial to reach a rung is alone there and always promoted.
With one worker the first start point therefore ran all its epochs, and every later trial was pruned against it: in
6 of the 10 fair Fashion-MNIST studies of the overconfident campaign only trial 0 finished, and in one draw all five
methods "chose" it. So a trial is judged at a rung only against at least ``min_trials_per_rung`` other trials
holding a value there (fewer: promoted); the tuning sets it to the number of start points, so with one worker no
start point is pruned (each runs its whole length, all four compete on full runs) and every later trial is judged
against all of them. It is the rule of Optuna's median and percentile pruners' ``n_min_trials`` ("minimum
number of reported trial results at a step to judge whether to prune"), which ``SuccessiveHalvingPruner`` lacks; its
``bootstrap_count`` does the opposite (it *prunes* every trial until that many completed the rung).

And a trial gets one retry: a worker stopped by Ctrl-C asks for it itself (``retry_lost``, marking the trial
``LOST``); if the worker is then killed before Optuna stores the trial's end, its heartbeat stops too, and Optuna's
heartbeat retry must not ask a second time (two live attempts of one run folder).
``HeartbeatRetry`` skips a trial marked ``LOST``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

LOST = "lost"  # user attribute of a trial whose worker died (retried with the same parameters): not counted
RUNG_KEY = "completed_rung_{}"  # Optuna's system attribute of a trial's value at rung k


def superseded(trials: Iterable[FrozenTrial]) -> set[int]:
    """Numbers of the attempts that another trial retries in their place: those marked ``LOST``
    (``tuning.retry_lost``, a study restored from a bundle), and every dead attempt a heartbeat retry
    names (``failed_trial``: its first attempt; ``retry_history``: each attempt that died since)."""
    numbers: set[int] = set()
    for trial in trials:
        numbers.update(trial.system_attrs.get("retry_history", []))
        if trial.system_attrs.get("failed_trial") is not None:
            numbers.add(trial.system_attrs["failed_trial"])
        if trial.state == TrialState.FAIL and trial.user_attrs.get(LOST):
            numbers.add(trial.number)
    return numbers


def rung_attrs_of(trial: FrozenTrial) -> dict[str, float]:
    """The rungs ``trial`` completed, as the system attributes its retry inherits."""
    rungs, k = {}, 0
    while RUNG_KEY.format(k) in trial.system_attrs:
        rungs[RUNG_KEY.format(k)] = trial.system_attrs[RUNG_KEY.format(k)]
        k += 1
    return rungs


class _Competitors:
    """The study as the pruner reads it: every trial except the superseded attempts (writes go through)."""

    def __init__(self, study: optuna.Study):
        self._study = study

    def get_trials(self, *args, **kwargs) -> list[FrozenTrial]:
        trials = self._study.get_trials(*args, **kwargs)
        gone = superseded(trials)
        return [t for t in trials if t.number not in gone]

    def __getattr__(self, name: str):
        return getattr(self._study, name)


class RetryAwareHalving(optuna.pruners.SuccessiveHalvingPruner):
    """Optuna's asynchronous successive halving, with an interrupted attempt and its retry counted once, and no
    trial judged at a rung against fewer than ``min_trials_per_rung`` others (0: Optuna's own rule)."""

    def __init__(self, min_resource: int, reduction_factor: int, min_trials_per_rung: int = 0):
        super().__init__(min_resource=min_resource, reduction_factor=reduction_factor)
        self.min_trials_per_rung = min_trials_per_rung

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        competitors = _Competitors(study)
        if not super().prune(competitors, trial):  # type: ignore[arg-type]
            return False
        if self.min_trials_per_rung <= 0 or math.isnan(trial.intermediate_values[trial.last_step]):
            return True
        # Optuna recorded the trial's value at the rung it judged it on: the last one the trial now holds
        held = rung_attrs_of(study._storage.get_trial(trial._trial_id))
        key = RUNG_KEY.format(len(held) - 1)
        reached = sum(key in t.system_attrs for t in competitors.get_trials(deepcopy=False))
        return reached - 1 >= self.min_trials_per_rung  # fewer others: promoted, its value stays for later ones


class HeartbeatRetry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a trial whose worker died, except for one whose worker already asked for its retry."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not trial.user_attrs.get(LOST):
            super().__call__(study, trial)
