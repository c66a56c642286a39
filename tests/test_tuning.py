"""The fair protocol's Optuna studies: start points, equal budget, resume of a dead trial, pruning arithmetic."""

import math
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from mtl_cog.errors import UserError
from mtl_cog.experiments import halving, protocol, trial_retries, tuning

KNOBS = [protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True), protocol.Knob("leader_ratio", 1e-3, 1.0, log=True)]


def _study(tmp_path: Path, name: str = "ds-cog_fc", budget: int = 4, prune: bool = False) -> optuna.Study:
    return tuning.open_study(tuning.storage_url(tmp_path), name, epochs=9, prune=prune, budget=budget, knobs=KNOBS,
                             trial_seeds=[1000])


def test_the_study_starts_with_the_halton_points_then_tpe(tmp_path):
    study = _study(tmp_path, budget=6)
    tuning.enqueue_start(study, KNOBS, 6)
    tuning.enqueue_start(study, KNOBS, 6)  # again (a resumed driver): nothing added
    starts = protocol.start_points(KNOBS, tuning.start_count(6))
    assert tuning.start_count(6) == 3 and len(study.trials) == 3
    asked = []
    for _ in range(6):
        trial = study.ask()
        asked.append(tuning.suggest(trial, KNOBS))
        study.tell(trial, asked[-1]["optim.follower_lr"])  # any value: the lower the rate the better
    assert asked[:3] == starts  # the space-filling start, exactly
    assert all(1e-4 <= a["optim.follower_lr"] <= 1e-2 and 1e-3 <= a["leader_ratio"] <= 1 for a in asked)
    assert tuning.result(study, 6).best.params["optim.follower_lr"] == min(a["optim.follower_lr"] for a in asked)


def test_a_study_reopened_over_another_search_is_refused_and_the_same_search_resumes(tmp_path):
    study = _study(tmp_path)
    study.tell(study.ask(), 0.5)
    assert len(_study(tmp_path).trials) == 1  # the same search: resumed
    wider = [protocol.Knob("optim.follower_lr", 3e-4, 3e-2, log=True), KNOBS[1]]
    url = tuning.storage_url(tmp_path)
    same = dict(knobs=KNOBS, epochs=9, prune=False, trial_seeds=[1000])
    changes = {"range": {**same, "knobs": wider}, "epochs": {**same, "epochs": 5}, "pruning": {**same, "prune": True},
               "knobs": {**same, "knobs": KNOBS[:1]}, "tuning seed": {**same, "trial_seeds": [1001]},
               "tuning seeds": {**same, "trial_seeds": [1000, 1001]}}
    for change in changes.values():  # each alone makes the trials incomparable
        with pytest.raises(UserError, match=r"optim.follower_lr \[0.0001, 0.01\].*9 epochs; pruning off; trials "
                                            r"trained with seed\(s\) 1000.*new --out"):
            tuning.open_study(url, "ds-cog_fc", budget=4, **change)
    assert _study(tmp_path).user_attrs[tuning.SEARCH_ATTR] == tuning.search_record(KNOBS, 9, False, [1000])


@pytest.mark.parametrize("recorded", [{}, {"trial_seed": 1000}])  # before seeds were recorded; one seed, as an int
def test_a_study_recorded_in_an_older_form_resumes_with_the_same_seed_and_is_refused_another(tmp_path, recorded):
    study = _study(tmp_path)
    old = {k: v for k, v in tuning.search_record(KNOBS, 9, False, [1000]).items() if k != "trial_seeds"}
    study.set_user_attr(tuning.SEARCH_ATTR, old | recorded)
    _study(tmp_path)  # its trials trained with seed 1000, the default then and now
    with pytest.raises(UserError, match=r"seed\(s\) 1000, and this run.*seed\(s\) 1000 1001"):
        tuning.open_study(tuning.storage_url(tmp_path), "ds-cog_fc", epochs=9, prune=False, budget=4, knobs=KNOBS,
                          trial_seeds=[1000, 1001])


def test_a_study_pruned_on_each_epochs_own_nll_is_not_resumed_under_the_kept_checkpoint_rule(tmp_path):
    """Its trials' reports are another quantity: the pruner would compare the two at one rung."""
    study = _study(tmp_path, prune=True)
    older_rule = {**tuning.search_record(KNOBS, 9, True, [1000]), "prune": True}
    study.set_user_attr(tuning.SEARCH_ATTR, older_rule)
    with pytest.raises(UserError, match="pruning on each epoch's own validation NLL.*pruning on the kept checkpoint"):
        _study(tmp_path, prune=True)

def test_the_follower_start_rates_are_the_same_for_every_method():
    baseline = protocol.start_points(KNOBS[:1], 4)
    cog = protocol.start_points(KNOBS, 4)
    assert [p["optim.follower_lr"] for p in baseline] == [p["optim.follower_lr"] for p in cog]


def test_a_failed_trial_uses_up_its_budget_and_extras_are_never_chosen(tmp_path):
    study = _study(tmp_path, budget=3)
    first = study.ask()
    study.tell(first, state=TrialState.FAIL)  # a diverged trial: the method gets no extra proposal for it
    assert tuning.has_work(study, 3) and tuning.remaining(study, 3) == 2
    for value in (0.5, 0.7, 0.1):  # the third is an extra (two workers asked at once)
        study.tell(study.ask(), value)
    outcome = tuning.result(study, 3)
    assert [t.number for t in outcome.trials] == [0, 1, 2] and [t.number for t in outcome.extras] == [3]
    assert outcome.best.value == 0.5 and not outcome.unfinished and not tuning.has_work(study, 3)


def test_an_interrupted_trial_is_asked_again_and_continues_its_run_folder(tmp_path):
    study = _study(tmp_path, budget=2)
    study.enqueue_trial({"optim.follower_lr": 1e-3})

    def objective(trial):
        trial.suggest_float("optim.follower_lr", 1e-4, 1e-2, log=True)
        trial_retries.retry_lost(trial)  # what the worker does on Ctrl-C, before Optuna marks the trial failed
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        study.optimize(objective, n_trials=1)
    assert study.trials[0].state == TrialState.FAIL
    assert [t.number for t in tuning.counted_trials(study, 2)[0]] == [1]  # the waiting retry counts, not the lost one
    retry = study.ask({"optim.follower_lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    assert retry.params == {"optim.follower_lr": 1e-3} and trial_retries.first_attempt(retry) == 0


def test_a_trial_lost_with_its_worker_does_not_count(tmp_path):
    study = _study(tmp_path, budget=2)
    lost = study.ask()
    lost.set_user_attr(halving.LOST, True)  # restored from a bundle after its machine was lost: asked again
    study.tell(lost, state=TrialState.FAIL)
    assert tuning.remaining(study, 2) == 2
    assert [t.number for t in tuning.result(study, 2).uncounted] == [0]


def test_a_running_trial_leaves_the_tuning_unfinished(tmp_path):
    study = _study(tmp_path, budget=2)
    study.tell(study.ask(), 0.3)
    study.ask()  # still running (or its worker died)
    outcome = tuning.result(study, 2)
    assert len(outcome.unfinished) == 1 and outcome.best.value == 0.3
    assert not tuning.has_work(study, 2)  # nothing to ask: the running one must finish or go stale


def test_a_dead_trial_is_retried_with_its_parameters_and_its_first_number(tmp_path):
    study = tuning.open_study(tuning.storage_url(tmp_path), "s", epochs=9, prune=False, budget=2, knobs=KNOBS,
                              trial_seeds=[1000])
    dead = study.ask({"optim.follower_lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    study._storage.record_heartbeat(dead._trial_id)  # its worker beat once, then died
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(3)  # as open_study's, with a 1 s grace period
    storage = optuna.storages.RDBStorage(tuning.storage_url(tmp_path), heartbeat_interval=1, grace_period=1,
                                         heartbeat_stale_trial_callback=retry)
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(optuna.load_study(study_name="s", storage=storage))
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL and trials[1].state == TrialState.WAITING
    retry = study.ask()
    assert retry.params == dead.params and trial_retries.first_attempt(retry) == 0  # continues trial_00
    assert tuning.has_work(study, 2)
    study.tell(retry, 0.4)
    assert [t.number for t in tuning.counted_trials(study, 2)[0]] == [1]  # the retry stands in for the dead one


def test_successive_halving_expected_share_known_answers():
    # 9 trials, 9 epochs: rungs at 1 and 3; 9 trials x 1 epoch + 3 x 2 + 1 x 6 = 21 of 81
    assert tuning.expected_epoch_share(9, 9) == pytest.approx(21 / 81)
    assert tuning.expected_epoch_share(5, 1) == 1.0  # no rung below the last epoch: nothing pruned
    assert tuning.expected_epoch_share(5, 2) == pytest.approx((5 + 5 / 3) / 10)  # a rung at epoch 1
    assert tuning.min_resource(100) == 11


def test_epochs_trained_by_a_pruned_trial_are_up_to_its_last_report(tmp_path):
    study = _study(tmp_path, budget=2, prune=True)
    trial = study.ask()
    for epoch, value in ((1, 0.9), (2, 0.8), (3, 0.7)):
        trial.report(value, epoch)
    study.tell(trial, state=TrialState.PRUNED)
    assert tuning.epochs_trained(study.trials[0], 9) == 3
    study.tell(study.ask(), 0.5)
    assert tuning.epochs_trained(study.trials[1], 9) == 9
    spec = tuning.StudySpec("ds", "cog_fc", Path("c.yaml"), (), 1e-3, tuple(KNOBS), 9, tmp_path, (1000,))
    rows = tuning.trials_table(spec, tuning.result(study, 2))
    assert [r["state"] for r in rows] == ["pruned", "complete"] and math.isnan(rows[0]["val_nll"])
    assert [r["chosen"] for r in rows] == ["", "*"]


class _RecordingTrial:
    """The two calls pruning_hook makes on an Optuna trial; never prunes."""

    def __init__(self):
        self.reports = []

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return False


def _epoch_end(epoch: int, nll: float, best_epoch: int):
    from mtl_cog.training.loop import EpochEnd

    return EpochEnd("stage_one", epoch, 0.0, {"mean": {"nll": nll}}, None, None, epoch == best_epoch, best_epoch, True)


def test_pruning_reports_the_kept_checkpoints_nll_not_the_epochs_own(tmp_path):
    """A noisy epoch after a good checkpoint reports that checkpoint's NLL, the value the study ranks by."""
    from mtl_cog.experiments.fair_tuning import pruning_hook
    from mtl_cog.runs import rundir
    from mtl_cog.runs.metrics_log import append_line

    trial = _RecordingTrial()
    hook = pruning_hook(trial, tmp_path, True).on_epoch_end
    for epoch, nll, best in ((1, 0.9, 1), (2, 0.7, 2), (3, 1.4, 2), (4, 0.6, 4)):
        append_line(tmp_path / rundir.METRICS, {"epoch": epoch, "stage": "stage_one", "val": {"nll": nll}})
        hook(_epoch_end(epoch, nll, best))
    assert trial.reports == [(1, 0.9), (2, 0.7), (3, 0.7), (4, 0.6)]

    # A trial resumed after a kill: its first epoch did not improve; the kept NLL comes from the file.
    resumed = _RecordingTrial()
    pruning_hook(resumed, tmp_path, True).on_epoch_end(_epoch_end(5, 2.0, 4))
    assert resumed.reports == [(5, 0.6)]


def test_pruning_refuses_a_run_whose_kept_epoch_has_no_metrics_line(tmp_path):
    from mtl_cog.experiments.fair_tuning import pruning_hook

    with pytest.raises(UserError, match="epoch 4"):
        pruning_hook(_RecordingTrial(), tmp_path, True).on_epoch_end(_epoch_end(5, 2.0, 4))


def test_a_range_is_widened_past_the_edge_its_choice_sat_at_within_the_knobs_limits():
    rate = protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True)
    assert protocol.widened(rate, "highest") == protocol.Knob("optim.follower_lr", 1e-4, 0.1, log=True)
    assert protocol.widened(rate, "lowest").low == pytest.approx(1e-5)
    ratio = protocol.Knob(protocol.LEADER_RATIO_KEY, 1e-3, 1.0, log=True, ceiling=1.0)
    assert protocol.widened(ratio, "highest") is None  # ratio 1 is no hierarchy: the top of COG's range
    assert protocol.widened(ratio, "lowest").low == pytest.approx(1e-4)
    eps = protocol.LOSS_KNOBS["ls"]
    assert protocol.widened(eps, "lowest").low == eps.floor  # 0.02 - 0.09 would be negative
    assert protocol.widened(protocol.widened(eps, "lowest"), "lowest") is None  # at its floor: nothing to widen


def test_legacy_widen_makes_a_new_study_only_for_choices_at_an_edge(tmp_path):
    import pandas as pd

    from mtl_cog.experiments import study_rules

    def spec(method):
        return tuning.StudySpec("d", method, (Path("c.yaml"),), (f"output_dir={tmp_path / ('d-' + method)}",), 1e-3,
                                (protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True),), 5,
                                tmp_path / f"d-{method}", (1000,))
    studies = {("d", m, "1"): spec(m) for m in ("a", "b")}
    chosen = pd.DataFrame([{"dataset": "d", "method": "a", "draw": "1", "at_edge": "optim.follower_lr=highest"},
                           {"dataset": "d", "method": "b", "draw": "1", "at_edge": ""}])
    wider = study_rules.widen(studies, chosen, 1, alike=False)  # the legacy rule (tests/test_paper_protocol.py: alike)
    assert list(wider) == [("d", "a", "1")]
    new = wider[("d", "a", "1")]
    assert new.name == "d-a-w1" and new.knobs[0].high == pytest.approx(0.1) and new.folder.name == "d-a-w1"
    assert f"output_dir={tmp_path / 'd-a-w1'}" in new.overrides


def test_a_study_restored_from_a_bundle_written_between_two_trials(tmp_path):
    """Waiting rows (enqueued start points) carry their parameters; they are asked again, not failed."""
    import pandas as pd

    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.experiments import fair_tuning

    study = _study(tmp_path, budget=4)
    tuning.enqueue_start(study, KNOBS, 4)
    trial = study.ask({k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS})
    trial.set_user_attr("overrides", "x")
    trial.set_user_attr("run", "trial_00")
    study.tell(trial, 0.5)
    spec = tuning.StudySpec("ds", "cog_fc", (Path("c.yaml"),), (), 1e-3, tuple(KNOBS), 9, tmp_path / "ds-cog_fc",
                            (1000,))
    table = pd.DataFrame(tuning.trials_table(spec, tuning.result(study, 4)))
    assert table.loc[table["state"] == "waiting", "optim.follower_lr"].notna().all()
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c"})
    bundle.set_trials(spec.name, table)
    bundles.write_bundle(tmp_path / "b", bundle)
    (tmp_path / "fresh").mkdir()
    fresh = tuning.open_study(tuning.storage_url(tmp_path / "fresh"), "ds-cog_fc", epochs=9, prune=False, budget=4,
                              knobs=KNOBS, trial_seeds=[1000])
    fair_tuning.restore_study(fresh, spec, bundles.read_bundle(tmp_path / "b"))
    states = [t.state for t in fresh.get_trials()]
    assert states[0] == TrialState.COMPLETE and TrialState.WAITING in states and TrialState.FAIL not in states


def test_a_restored_study_prunes_against_the_same_rung_values_as_the_uninterrupted_one(tmp_path):
    """trials.csv carries each trial's rung values and epochs: a study restored from the bundle on a fresh machine
    holds the same successive-halving competitors, so the next trial is pruned exactly when it would have been
    (without them a lone trial at a rung is always promoted)."""
    import pandas as pd

    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.experiments import fair_tuning

    def run_trial(study, curve):
        trial = study.ask({k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS})
        trial.set_user_attr("overrides", "x")
        trial.set_user_attr("run", f"trial_{trial.number:02d}")
        for epoch, value in enumerate(curve, start=1):
            trial.report(value, epoch)
            if trial.should_prune():
                study.tell(trial, state=TrialState.PRUNED)
                return "pruned"
        study.tell(trial, curve[-1])
        return "complete"

    good = [1.0 - 0.05 * e for e in range(9)]
    bad = [2.0 - 0.01 * e for e in range(9)]
    (tmp_path / "a").mkdir()
    study = _study(tmp_path / "a", budget=6, prune=True)
    assert [run_trial(study, curve) for curve in (good, good, bad)] == ["complete", "complete", "pruned"]
    spec = tuning.StudySpec("ds", "cog_fc", (Path("c.yaml"),), (), 1e-3, tuple(KNOBS), 9, tmp_path / "ds-cog_fc",
                            (1000,))
    table = pd.DataFrame(tuning.trials_table(spec, tuning.result(study, 6)))
    assert (table["rung_values"] != "").all() and table.loc[2, "epochs_trained"] < 9
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c"})
    bundle.set_trials(spec.name, table)
    bundles.write_bundle(tmp_path / "b", bundle)
    (tmp_path / "fresh").mkdir()
    fresh = _study(tmp_path / "fresh", budget=6, prune=True)
    fair_tuning.restore_study(fresh, spec, bundles.read_bundle(tmp_path / "b"))
    for before, after in zip(study.get_trials(), fresh.get_trials()):
        assert tuning.rung_values(after) == tuning.rung_values(before)
        assert tuning.epochs_trained(after, 9) == tuning.epochs_trained(before, 9)
    # the next (mediocre) trial: pruned in both, as the earlier trials' rung values outrank it
    assert run_trial(study, bad) == run_trial(fresh, bad) == "pruned"
    restored_rows = pd.DataFrame(tuning.trials_table(spec, tuning.result(fresh, 6)))
    assert restored_rows["epochs_trained"].tolist()[:3] == table["epochs_trained"].tolist()


def test_rung_values_round_trip_and_an_old_bundle_without_them_restores_none():
    assert tuning.rung_attrs("0.5 0.25") == {"completed_rung_0": 0.5, "completed_rung_1": 0.25}
    assert tuning.rung_attrs("") == tuning.rung_attrs(float("nan")) == tuning.rung_attrs(None) == {}
    # a trials.csv whose rung_values cells all hold one value is read back by pandas as numbers
    assert tuning.rung_attrs(0.75) == {"completed_rung_0": 0.75}


def test_two_draws_never_share_a_tpe_stream():
    """A worker re-seeds TPE with the draw's seed + the trials so far (``tuning.reseed``): draws whose seeds were
    one apart gave draw 2 after n trials the stream of draw 1 after n + 1, and so the same candidates. Every
    seed a draw's studies can reach (its budget's trials, a retry of each, two widened re-tunings) is its own."""
    reach = 3 * 2 * protocol.MAX_BUDGET
    seeds = [set(range(protocol.sampler_seed(d), protocol.sampler_seed(d) + reach)) for d in range(1, 11)]
    assert protocol.sampler_seed(1) == protocol.SAMPLER_SEED  # the first draw's proposals are what they were
    assert all(not (a & b) for i, a in enumerate(seeds) for b in seeds[i + 1:])
    assert protocol.start_points(KNOBS, 3, protocol.sampler_seed(1)) != protocol.start_points(
        KNOBS, 3, protocol.sampler_seed(2))  # another Halton scramble


def test_a_study_whose_start_points_were_drawn_with_another_seed_is_refused(tmp_path):
    """Every study of a draw starts from the same follower rates. A study created before the draws' seeds changed
    (its start points enqueued, not yet asked) must not run its old points under the new seed."""
    study = _study(tmp_path, budget=6)
    tuning.enqueue_start(study, KNOBS, 6, protocol.sampler_seed(1))  # created: points enqueued, none asked
    tuning.enqueue_start(study, KNOBS, 6, protocol.sampler_seed(1))  # resumed with the same seed: fine
    assert len(study.get_trials()) == tuning.start_count(6)
    with pytest.raises(UserError, match="created under another seed"):
        tuning.enqueue_start(study, KNOBS, 6, protocol.sampler_seed(2))


def test_after_a_stopped_trial_the_next_proposal_is_the_uninterrupted_ones(tmp_path):
    """The sampler is seeded with the trials so far; an attempt a retry replaced adds one to Optuna's count and
    nothing to TPE's history, so it must not shift the seed of the proposals after it."""
    def tune(folder, interrupt):
        folder.mkdir()
        study = _study(folder, budget=6)
        tuning.enqueue_start(study, KNOBS, 6)
        space = {k.key: optuna.distributions.FloatDistribution(k.low, k.high, log=k.log) for k in KNOBS}
        proposals = []
        for n in range(5):
            tuning.reseed(study, 7, 6)
            trial = study.ask(space)
            if interrupt and n == 3:  # a TPE proposal (3 start points first): its retry is asked next
                trial_retries.retry_lost(trial)
                study.tell(trial, state=TrialState.FAIL)
                tuning.reseed(study, 7, 6)
                trial = study.ask(space)  # the retry: same parameters, asked first
            proposals.append(dict(trial.params))
            study.tell(trial, 0.5 + 0.01 * n)
        return proposals

    assert tune(tmp_path / "a", interrupt=False) == tune(tmp_path / "b", interrupt=True)


def test_a_study_reopened_with_other_pinned_values_is_refused_naming_both(tmp_path):
    """The search record holds the pinned values (``--pin-to``): a study reopened with another pinning is refused,
    and the message shows both pinnings (it once left them out, so its two halves read the same)."""
    url = tuning.storage_url(tmp_path)
    knobs = KNOBS[1:]
    tuning.open_study(url, "ds-cog_fc", epochs=9, prune=False, budget=4, knobs=knobs, trial_seeds=[1000],
                      pinned={"optim.follower_lr": 0.0082})
    tuning.open_study(url, "ds-cog_fc", epochs=9, prune=False, budget=4, knobs=knobs, trial_seeds=[1000],
                      pinned={"optim.follower_lr": 0.0082})  # the same pinning resumes
    with pytest.raises(UserError, match=r"pinned optim.follower_lr=0.0082, and this run asks .*"
                                        r"pinned optim.follower_lr=0.0026"):
        tuning.open_study(url, "ds-cog_fc", epochs=9, prune=False, budget=4, knobs=knobs, trial_seeds=[1000],
                          pinned={"optim.follower_lr": 0.0026})
