"""The pinned controls (mtl_cog/experiments/pinning.py): a COG variant's shared knobs fixed at its counterpart's
choice in the same draw of a committed fair campaign, only the leader tuned."""

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from test_tuning import KNOBS

from mtl_cog.config import search_ranges
from mtl_cog.errors import UserError
from mtl_cog.experiments import pinning, protocol, tuning

FAIR = Path(__file__).parents[1] / "results" / "overconfident_fair_fashion_mnist"
SMOOTHING = protocol.Knob("method.label_smoothing", 0.02, 0.2, log=False)


def _spec(method, draw="1", knobs=(*KNOBS, SMOOTHING)):
    return tuning.StudySpec("fashion_mnist", method, (), (), 1e-3, tuple(knobs), 30, Path("x"), (1000,), draw)


def test_cog_ls_is_pinned_to_what_ls_chose_in_the_same_draw():
    studies = {("fashion_mnist", "cog_ls", d): _spec("cog_ls", d) for d in ("1", "2")}
    pinned = pinning.pinned_studies(studies, FAIR, {"cog_ls": "ls"}, "overconfident")
    first, second = pinned[("fashion_mnist", "cog_ls", "1")], pinned[("fashion_mnist", "cog_ls", "2")]
    # LS's chosen trials: draw 1 follower 0.0026 and smoothing 0.065, draw 2 0.00018 and 0.067 (trials.csv)
    assert dict(first.pinned) == {"optim.follower_lr": 0.0026, "method.label_smoothing": 0.065}
    assert dict(second.pinned) == {"optim.follower_lr": 0.00018, "method.label_smoothing": 0.067}
    assert [k.key for k in first.knobs] == ["leader_ratio"]  # the leader alone is tuned
    setting = protocol.resolve({**dict(first.pinned), "leader_ratio": 0.1})
    assert setting["optim.leader_lr"] == pytest.approx(0.00026) and setting["method.label_smoothing"] == 0.065


def test_cog_fc_is_pinned_to_the_baselines_rate():
    pinned = pinning.pinned_studies({("fashion_mnist", "cog_fc", "1"): _spec("cog_fc", knobs=KNOBS)}, FAIR / "bundle",
                                    {"cog_fc": "baseline"}, "overconfident")
    assert dict(pinned[("fashion_mnist", "cog_fc", "1")].pinned) == {"optim.follower_lr": 0.000825938}


@pytest.mark.parametrize("where, counterparts, scale, message", [
    ("nowhere", {"cog_ls": "ls"}, "overconfident", "no results bundle"),
    ("results/overconfident_paper_fashion_mnist", {"cog_ls": "ls"}, "overconfident", "did not run the fair"),
    (str(FAIR), {}, "overconfident", "has no counterpart"),
    (str(FAIR), {"cog_ls": "ls"}, "cpu", "--scale overconfident"),
    (str(FAIR), {"cog_ls": "focal"}, "overconfident", "0 chosen trials"),
])
def test_what_cannot_be_pinned_is_refused(tmp_path, where, counterparts, scale, message):
    folder = Path(__file__).parents[1] / where if not where.startswith("/") else Path(where)
    with pytest.raises(UserError, match=message):
        pinning.pinned_studies({("fashion_mnist", "cog_ls", "1"): _spec("cog_ls")}, folder, counterparts, scale)


ROOT = Path(__file__).parents[1]
MOSAIC_FAIR = ROOT / "results" / "overconfident_fair_fashion_mosaic"


def _dry_run(in_process, out, bundle, pin_to, *plan):
    """The mosaic's arm C command (the page's), dry, against a copy of ``bundle`` in ``out``."""
    import shutil

    from mtl_cog.cli import reproduce

    shutil.copytree(bundle, out / "bundle")
    return in_process(reproduce, "--protocol", "fair", "--scale", "overconfident", "--data", "fashion_mosaic",
                      "--method", "cog_ls", "cog_fc", "--budget", "8", "--prune", "--draws", "2",
                      *(["--pin-to", pin_to] if pin_to else []), "--seeds", "0", "1", "2", "3", "4", "--jobs", "1",
                      "--tune-workers", "1", "--threads", "1", *plan, "--out", out, "--dry-run")


AMENDMENT = ("--epoch-budget", "160", "--plan", "docs/results/overconfident-plan-amendment-1.md")


def test_a_pinned_campaign_resumes_from_its_bundle(tmp_path, in_process, monkeypatch):
    """A pinned study's trials start from its leader's start points alone: the start-point check must see the pinned
    study (it once saw the unpinned one, read the pinned follower rate as NaN and refused every resume)."""
    monkeypatch.chdir(ROOT)  # a plan is named relative to the repository root
    done = _dry_run(in_process, tmp_path, ROOT / "results" / "overconfident_pinned_fashion_mosaic" / "bundle",
                    MOSAIC_FAIR, *AMENDMENT)
    assert done.returncode == 0, done.stderr
    assert "optim.follower_lr pinned at 0.0082" in done.stdout and "error" not in done.stderr


@pytest.mark.parametrize("bundle, pin_to, plan, why", [
    ("overconfident_pinned_fashion_mosaic", None, AMENDMENT,
     "the recorded study held optim.follower_lr fixed (pinned), which this command searches"),
    ("overconfident_fair_fashion_mosaic", MOSAIC_FAIR, ("--plan", "docs/results/overconfident-plan.md"),
     "this command pins optim.follower_lr, which the recorded study searched"),
])
def test_a_campaign_resumed_with_another_pinning_is_refused(tmp_path, in_process, monkeypatch, bundle, pin_to, plan,
                                                             why):
    """A pinned campaign resumed without --pin-to (or a tuned one with it) would rank trials of two searches in one
    study: refused before anything runs (a dry run too), naming both searches and what differs."""
    monkeypatch.chdir(ROOT)
    done = _dry_run(in_process, tmp_path, ROOT / "results" / bundle / "bundle", pin_to, *plan)
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
    assert "study fashion_mosaic-cog_fc searched" in done.stderr and why in done.stderr


def _rows(ranges, overrides):
    return pd.DataFrame({"trial": range(len(overrides)), "ranges": ranges, "overrides": overrides})


PINNED_FC = dataclasses.replace(_spec("cog_fc", knobs=KNOBS[1:]), pinned=(("optim.follower_lr", 0.0082),))
LEADER = "leader_ratio=log[0.001,1]"


@pytest.mark.parametrize("rows, message", [
    (_rows([LEADER] * 2, ["optim.follower_lr=0.0082 optim.leader_lr=0.00019", None]), None),  # a waiting row
    (_rows([None, None], [None, None]), None),  # ranges not recorded (older bundles): nothing to compare
    (pd.DataFrame({"trial": [0]}), None),
    (_rows([LEADER], ["optim.follower_lr=0.0026 optim.leader_lr=6e-05"]), "ran with optim.follower_lr at 0.0026"),
    (_rows(["leader_ratio=log[0.01,1]"], [None]), "the same knobs over other ranges"),
])
def test_a_recorded_study_must_search_and_pin_what_this_command_does(rows, message):
    """``check_same_knobs`` on the bundle's rows alone: a pinned value that changed (the --pin-to bundle's choice
    moved) or other ranges are refused; rows without ranges (bundles from before they were recorded) or waiting
    rows without overrides are not read as a difference."""
    from mtl_cog.experiments import study_rules

    assert search_ranges.ranges_text(list(PINNED_FC.knobs)) == LEADER
    if message is None:
        study_rules.check_same_knobs(PINNED_FC, rows)
    else:
        with pytest.raises(UserError, match=message):
            study_rules.check_same_knobs(PINNED_FC, rows)


def test_the_pin_is_the_counterparts_last_widening():
    """A counterpart re-tuned with --widen ran its finals at the last widening's choice: that study is pinned to."""
    trials = pd.DataFrame({"study": ["fm-ls", "fm-ls-w1", "fm-ls-w2", "fm-ls-d2", "fm-ls-d2-w1", "fm-ls-wx", None]})
    assert pinning.last_widening(trials, "fm-ls") == "fm-ls-w2"
    assert pinning.last_widening(trials, "fm-ls-d2") == "fm-ls-d2-w1"
    assert pinning.last_widening(trials, "fm-baseline") == "fm-baseline"


def test_knob_values_reads_the_numbers_a_trial_ran_with():
    """trials.csv's ``overrides`` as the pinning, the resume check and the draw table read it: finite numbers only."""
    text = "optim.follower_lr=0.0082 optim.leader_lr=1.9e-04 optim.allow_leader_lr_geq_follower=true x=nan junk"
    assert search_ranges.knob_values(text) == {"optim.follower_lr": 0.0082, "optim.leader_lr": 0.00019}
    assert search_ranges.knob_values("") == {} and search_ranges.knob_values(float("nan")) == {}
