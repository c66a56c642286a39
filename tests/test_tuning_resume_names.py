"""A tuning worker killed mid-trial: the retry keeps its folder, and later trials keep theirs."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from mtl_cog.experiments import protocol, trial_retries, tuning

KNOBS = [protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True)]


def _open(tmp_path: Path) -> optuna.Study:
    return tuning.open_study(tuning.storage_url(tmp_path), "s", epochs=9, prune=False, budget=4, knobs=KNOBS,
                             trial_seeds=[1000])


def _run(study: optuna.Study, value: float) -> int:
    trial = study.ask()
    tuning.suggest(trial, KNOBS)
    number = trial_retries.run_number(trial)
    study.tell(trial, value)
    return number


def _kill_running_trial(study: optuna.Study, tmp_path: Path) -> None:
    """The worker of the running trial beat once and died; the next worker finds it stale and retries it."""
    dead = study.ask()
    tuning.suggest(dead, KNOBS)
    study._storage.record_heartbeat(dead._trial_id)
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(3)  # as open_study's, with a 1 s grace period
    storage = optuna.storages.RDBStorage(tuning.storage_url(tmp_path), heartbeat_interval=1, grace_period=1,
                                         heartbeat_stale_trial_callback=retry)
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(optuna.load_study(study_name="s", storage=storage))


def test_a_retried_trial_shifts_no_later_folder(tmp_path):
    study = _open(tmp_path)
    folders = [_run(study, 0.5), _run(study, 0.4)]
    _kill_running_trial(study, tmp_path)  # Optuna's trial 2 fails; its retry is trial 3
    folders += [_run(study, 0.3), _run(study, 0.35)]  # the retry, then a new trial (Optuna's 4)
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert folders == [0, 1, 2, 3]  # trial_00 .. trial_03, as without the kill (not trial_04)
    assert trial_retries.run_numbers(study) == {0: 0, 1: 1, 2: 2, 3: 2, 4: 3}


def test_a_lost_trial_retried_by_its_worker_keeps_its_folder_too(tmp_path):
    study = _open(tmp_path)
    _run(study, 0.5)
    lost = study.ask()
    tuning.suggest(lost, KNOBS)
    trial_retries.retry_lost(lost)  # a worker being stopped asks for its trial again
    study.tell(lost, state=TrialState.FAIL)
    assert [_run(study, 0.3), _run(study, 0.2)] == [1, 2]


def test_a_study_from_before_keeps_its_folder_names(tmp_path):
    study = _open(tmp_path)
    study.set_user_attr(trial_retries.NUMBERING_ATTR, None)  # started before folders counted first attempts
    _run(study, 0.5)
    _kill_running_trial(study, tmp_path)
    assert [_run(study, 0.3), _run(study, 0.2)] == [1, 3]  # the retry of 1, then Optuna's number 3
