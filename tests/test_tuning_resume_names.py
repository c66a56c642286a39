"""A tuning worker killed mid-trial: the retry keeps its folder, later trials keep theirs, the count stays right."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from mtl_cog.experiments import protocol, tuning

KNOBS = [protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True)]


def _open(tmp_path: Path) -> optuna.Study:
    return tuning.open_study(tuning.storage_url(tmp_path), "s", epochs=9, prune=False, budget=4, knobs=KNOBS,
                             trial_seeds=[1000])


def _run(study: optuna.Study, value: float) -> int:
    trial = study.ask()
    tuning.suggest(trial, KNOBS)
    number = tuning.run_number(trial)
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


def test_a_retried_trial_shifts_no_later_folder_and_trials_csv_matches_an_uninterrupted_tuning(tmp_path):
    study = _open(tmp_path)
    folders = [_run(study, 0.5), _run(study, 0.4)]
    _kill_running_trial(study, tmp_path)  # Optuna's trial 2 fails; its retry is trial 3
    folders += [_run(study, 0.3), _run(study, 0.35)]  # the retry, then a new trial (Optuna's 4)
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert folders == [0, 1, 2, 3]  # trial_00 .. trial_03, as without the kill (not trial_04)
    outcome = tuning.result(study, 4)
    spec = tuning.StudySpec("ds", "m", Path("c.yaml"), (), 1e-3, tuple(KNOBS), 9, tmp_path, (1000,))
    rows = tuning.trials_table(spec, outcome)
    assert [r["trial"] for r in rows] == [0, 1, 2, 3] and outcome.best.number == 3
    assert next(r for r in rows if r["chosen"])["trial"] == 2  # the chosen trial's folder: trial_02


def test_the_count_of_finished_trials_after_a_worker_was_killed(tmp_path):
    study = _open(tmp_path)
    _run(study, 0.5)
    _kill_running_trial(study, tmp_path)
    outcome = tuning.result(study, 4)
    assert [t.state for t in outcome.trials] == [TrialState.COMPLETE, TrialState.WAITING]
    assert outcome.finished == 1  # was reported as "-1 of 4 trials finished"
    assert len(outcome.trials) - len(outcome.unfinished) == -1  # why the old count was wrong: never-asked ones


def test_a_study_from_before_keeps_its_folder_names(tmp_path):
    study = _open(tmp_path)
    study.set_user_attr(tuning.NUMBERING_ATTR, None)  # started before folders counted first attempts
    _run(study, 0.5)
    _kill_running_trial(study, tmp_path)
    assert [_run(study, 0.3), _run(study, 0.2)] == [1, 3]  # the retry of 1, then Optuna's number 3
