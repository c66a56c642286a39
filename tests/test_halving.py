"""Successive halving across interrupted trials: a retry holds the rungs its run passed, the attempt it replaces
competes no more, and a trial gets one retry (mtl_cog/experiments/halving.py)."""

from pathlib import Path

import optuna
from optuna.trial import TrialState
from test_tuning import KNOBS, _study

from mtl_cog.experiments import halving, trial_retries, tuning


def test_an_interrupted_trial_keeps_the_rungs_it_reached_and_is_judged_once(tmp_path):
    """A trial stopped after epoch 4 and asked again continues from epoch 5. Its retry holds the values its run
    had at the rungs it passed (epochs 1 and 3), not the epoch-5 value at every earlier rung; and the attempt it
    replaces is no competitor any more, so one run is counted once. Without both, the next trial, the best at
    epoch 1 (0.57), was pruned against the retry's epoch-5 value 0.30 standing at the 1-epoch rung."""
    study = _study(tmp_path, budget=6, prune=True)  # 9 epochs: rungs at 1, 3, 9
    space = {k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS}

    def report(trial, curve, first_epoch=1):
        for epoch, value in enumerate(curve, start=first_epoch):
            trial.report(value, epoch)
            if trial.should_prune():
                return "pruned"
        return "alive"

    first = study.ask(space)
    assert report(first, [0.60, 0.55, 0.50, 0.49, 0.48, 0.47, 0.46, 0.45, 0.44]) == "alive"
    study.tell(first, 0.44)
    stopped = study.ask(space)
    assert report(stopped, [0.58, 0.52, 0.45, 0.44]) == "alive"  # the best at rungs 1 and 3, then stopped
    trial_retries.retry_lost(stopped)
    study.tell(stopped, state=TrialState.FAIL)
    retry = study.ask(space)
    assert retry.params == stopped.params and trial_retries.first_attempt(retry) == 1
    assert report(retry, [0.30, 0.29], first_epoch=5) == "alive"
    retried = study.get_trials()[retry.number]
    assert tuning.rung_values(retried) == "0.58 0.45"  # its run's own values at epochs 1 and 3
    assert halving.superseded(study.get_trials()) == {stopped.number}
    assert [t.number for t in halving._Competitors(study).get_trials()] == [0, retry.number]
    study.tell(retry, 0.29)
    nxt = study.ask(space)
    assert report(nxt, [0.57]) == "alive"  # the best at the 1-epoch rung: promoted


def test_a_dead_trial_and_its_heartbeat_retry_are_one_competitor(tmp_path):
    study = _study(tmp_path, budget=4, prune=True)
    dead = study.ask({k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS})
    dead.report(0.5, 1)
    assert not dead.should_prune()  # records its 1-epoch rung
    study.tell(dead, state=TrialState.FAIL)
    frozen = study.get_trials()[0]
    optuna.storages.RetryHeartbeatStaleTrialCallback(3)(study, frozen)  # what the heartbeat does for a dead one
    retry = study.get_trials()[1]
    assert tuning.rung_values(retry) == "0.5" and halving.superseded(study.get_trials()) == {0}
    assert [t.number for t in halving._Competitors(study).get_trials()] == [1]
    assert [t.number for t in tuning.counted_trials(study, 4)[0]] == [1]


def test_a_trial_whose_worker_asked_for_its_retry_gets_no_second_one_from_the_heartbeat(tmp_path):
    """Ctrl-C asks for the retry (retry_lost); a worker then killed before Optuna stored the trial's end leaves it
    running, and its heartbeat goes stale: Optuna's heartbeat retry would ask again, two live attempts of one run
    folder both counted and both competing."""
    study = _study(tmp_path, budget=4, prune=True)
    stopped = study.ask({k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS})
    trial_retries.retry_lost(stopped)  # ... and the worker is killed before the tell: the trial stays running
    study.tell(stopped, state=TrialState.FAIL)  # what the stale heartbeat then does
    halving.HeartbeatRetry(3)(study, study.get_trials()[0])
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]  # one retry, not two
    assert [t.number for t in tuning.counted_trials(study, 4)[0]] == [1]


def test_a_restored_failed_extra_stays_a_failure_and_only_a_lost_trial_is_superseded(tmp_path):
    import pandas as pd

    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.experiments import fair_tuning

    spec = tuning.StudySpec("ds", "cog_fc", (Path("c.yaml"),), (), 1e-3, tuple(KNOBS), 9, tmp_path / "ds-cog_fc",
                            (1000,))
    row = {"optim.follower_lr": 1e-3, "leader_ratio": 0.1, "overrides": "x", "retry_of": "", "val_nll": float("nan"),
           "epochs_trained": 1, "rung_values": "0.3", "study": spec.name, "draw": "1"}
    table = pd.DataFrame([
        {**row, "trial": 0, "run": "trial_00", "state": "complete", "counted": True, "reason": "", "val_nll": 0.2},
        {**row, "trial": 1, "run": "trial_01", "state": "fail", "counted": False, "reason": "FloatingPointError: x"},
        {**row, "trial": 2, "run": "trial_02", "state": "fail", "counted": False, "reason": trial_retries.LOST_REASON}])
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c"})
    bundle.set_trials(spec.name, table)
    bundles.write_bundle(tmp_path / "b", bundle)
    fresh = _study(tmp_path, budget=1, prune=True)
    assert fair_tuning.restore_study(fresh, spec, bundles.read_bundle(tmp_path / "b")) == 3
    assert halving.superseded(fresh.get_trials()) == {2}  # the extra that diverged still competed at its rung
