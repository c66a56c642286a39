"""The tuning rule (mtl_cog/experiments/tuning_rule.py): no first trial wins unopposed, an epoch budget that caps a
study, the rule a bundle records binding its resume; and the paper protocol's schedules (protocol.py)."""

from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from optuna.trial import TrialState
from test_tuning import KNOBS

from mtl_cog.bundles.bundle import Bundle
from mtl_cog.config import load_config
from mtl_cog.config.schema import ConfigError
from mtl_cog.errors import UserError
from mtl_cog.experiments import fair_tuning, protocol, study_rules, tuning
from mtl_cog.experiments.tuning_rule import LEGACY_RULE, TuningRule, rule_of_row
from mtl_cog.training.optim import build_scheduler

EPOCHS = 9  # rungs at 1, 3 and 9 epochs
FAST_STARTER = [0.60] * EPOCHS  # the first start point: good at once, no better later
SLOW_STARTERS = [0.90, 0.70, 0.50, 0.40, 0.35, 0.30, 0.28, 0.26, 0.25]  # worse at the first rung, better by the end


def _tune(tmp_path: Path, rule: TuningRule, budget: int = 8) -> tuning.StudyResult:
    """One worker, trials in order: the first start point is the fast starter, every other trial a slow one."""
    study = tuning.open_study(tuning.storage_url(tmp_path), "ds-cog_fc", epochs=EPOCHS, prune=True, budget=budget,
                              knobs=KNOBS, trial_seeds=[1000], rule=rule)
    tuning.enqueue_start(study, KNOBS, budget)

    def objective(trial: optuna.Trial) -> float:
        tuning.suggest(trial, KNOBS)
        curve = FAST_STARTER if trial.number == 0 else SLOW_STARTERS
        for epoch, value in enumerate(curve, start=1):
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return curve[-1]

    while tuning.has_work(study, budget, rule, EPOCHS):
        study.optimize(objective, n_trials=1)
    return tuning.result(study, budget, rule, EPOCHS)


def test_the_legacy_rule_lets_the_first_trial_win_unopposed(tmp_path):
    """What the overconfident campaign's fair studies did: alone at every rung, trial 0 ran all its epochs; every
    later trial met it at the first rung, was worse there and was pruned, though it would have ended better."""
    outcome = _tune(tmp_path, LEGACY_RULE, budget=4)
    assert outcome.best.number == 0 and fair_tuning.unopposed(outcome)
    assert [t.state for t in outcome.trials[1:]] == [TrialState.PRUNED] * 3


def test_no_start_point_is_pruned_by_an_earlier_one(tmp_path):
    for budget in (4, 8):  # 2 and 4 start points
        rule = TuningRule(min_trials_per_rung=tuning.start_count(budget))
        (tmp_path / str(budget)).mkdir()
        outcome = _tune(tmp_path / str(budget), rule, budget)
        starts = tuning.start_count(budget)
        assert [t.state for t in outcome.trials[:starts]] == [TrialState.COMPLETE] * starts  # every start point ran
        assert outcome.best.number != 0 and not fair_tuning.unopposed(outcome)


def test_an_epoch_budget_ends_the_study_and_counts_its_epochs(tmp_path):
    rule = TuningRule(min_trials_per_rung=4, epoch_budget=4 * EPOCHS + 5)  # the start points, then 5 epochs
    outcome = _tune(tmp_path, rule)
    study = optuna.load_study(study_name="ds-cog_fc", storage=tuning.storage_url(tmp_path))
    spent = tuning.epochs_spent(study, 8, EPOCHS)
    assert rule.epoch_budget <= spent < rule.epoch_budget + EPOCHS  # the last trial ends once it is spent
    assert not outcome.unfinished and len(outcome.trials) < 8  # trials never asked are no unfinished work
    assert not tuning.has_work(study, 8, rule, EPOCHS)


def test_the_pruning_hook_stops_a_trial_once_the_epoch_budget_is_spent(tmp_path):
    from test_tuning import _epoch_end, _RecordingTrial

    hook = fair_tuning.pruning_hook(_RecordingTrial(), tmp_path, prune=False, budget_spent=lambda: True)
    with pytest.raises(optuna.TrialPruned, match="epoch budget is spent"):
        hook.on_epoch_end(_epoch_end(3, 0.5, 3))
    fair_tuning.pruning_hook(_RecordingTrial(), tmp_path, prune=False).on_epoch_end(_epoch_end(3, 0.5, 3))


def _specs(tmp_path, *methods, draw="1", rule=LEGACY_RULE):
    return {("ds", m, draw): tuning.StudySpec("ds", m, (), (), 1e-3, tuple(KNOBS), EPOCHS, tmp_path / m, (1000,),
                                              draw, rule=rule) for m in methods}


def _bundle(rows):
    return Bundle(campaign={}, trials=pd.DataFrame(rows))


def test_a_recorded_study_resumes_under_its_rule_and_mixed_rules_are_refused(tmp_path):
    new = TuningRule(4, 160)
    legacy_rows = [{"study": "ds-baseline", "trial": 0, "state": "complete"}]  # written before the rule existed
    bundle = _bundle(legacy_rows)
    kept = study_rules.recorded_rules(_specs(tmp_path, "baseline"), bundle, new, epoch_budget_given=False)
    assert kept[("ds", "baseline", "1")].rule == LEGACY_RULE
    with pytest.raises(UserError, match="--epoch-budget 160"):  # given, it would not take effect
        study_rules.recorded_rules(_specs(tmp_path, "baseline"), bundle, new, epoch_budget_given=True)
    with pytest.raises(UserError, match="different rules"):  # a new method beside a legacy study
        study_rules.recorded_rules(_specs(tmp_path, "baseline", "cog_fc"), bundle, new, epoch_budget_given=False)
    other_draw = study_rules.recorded_rules({**_specs(tmp_path, "baseline"), **_specs(tmp_path, "cog_fc", draw="2")},
                                            bundle, new, epoch_budget_given=False)
    assert other_draw[("ds", "cog_fc", "2")].rule == new  # a draw of its own: one rule within it


def test_trials_csv_rows_carry_the_rule():
    assert rule_of_row({"min_trials_per_rung": 4, "epoch_budget": 160}) == TuningRule(4, 160)
    assert rule_of_row({"min_trials_per_rung": 4.0, "epoch_budget": float("nan")}) == TuningRule(4, None)
    assert rule_of_row({}) == LEGACY_RULE


@pytest.mark.parametrize("schedule, live", [("scaled_period", 2), ("constant", 30), ("late_steps", 25)])
def test_the_paper_schedules_live_phase(schedule, live):
    base = load_config(["configs/fashion_mnist/cog_ts.yaml", "configs/scales/overconfident/fashion_mnist.yaml"])
    cfg = load_config(["configs/fashion_mnist/cog_ts.yaml", "configs/scales/overconfident/fashion_mnist.yaml"],
                      protocol.paper_overrides(base, multitask=False, schedule=schedule))
    assert protocol.live_epochs(cfg) == live
    assert f"= {live * 40:,} steps" in protocol.live_steps_text(cfg, 5000)  # 5,000 pictures at batch 128: 40 steps


def test_late_steps_steps_the_rate_after_two_thirds_and_five_sixths():
    assert protocol.schedule_overrides("late_steps", 30, False)[0] == "optim.lr_milestones=[20,25]"
    cfg = load_config(["configs/fashion_mnist/cog_ts.yaml"], ["train.epochs=30", "optim.follower_lr=1.0",
                                                              *protocol.schedule_overrides("late_steps", 30, False)])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, cfg.optim)
    rates = []
    for _ in range(30):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[19] == 1.0 and rates[20] == pytest.approx(0.1) and rates[25] == pytest.approx(0.01)
    with pytest.raises(UserError, match="at least 3 epochs"):
        protocol.schedule_overrides("late_steps", 2, False)


@pytest.mark.parametrize("overrides, message", [
    (["optim.lr_milestones=[25,20]"], "increasing"),
    (["optim.lr_milestones=[0]"], "increasing"),
    (["optim.lr_milestones=[20]", "optim.lr_step_epochs=10"], "would also step"),
    (["optim.lr_milestones=[30]", "optim.lr_step_epochs=1000000"], "never happens"),
])
def test_milestones_that_would_not_take_effect_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["configs/fashion_mnist/cog_ts.yaml"], ["train.epochs=30", *overrides])
