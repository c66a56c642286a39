"""The paper's protocol beside the fair one, and the tuning rules that keep two draws independent: start points
shifted at random per draw, final seeds that differ between draws, and a re-tuning offered to every method alike."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mtl_cog.config import load_config
from mtl_cog.config.search_ranges import Knob
from mtl_cog.errors import UserError
from mtl_cog.experiments import protocol, study_rules, tuning

KNOBS = [Knob("optim.follower_lr", 1e-4, 1e-2, log=True), Knob(protocol.LEADER_RATIO_KEY, 1e-3, 1.0, log=True)]


def _unit_follower(point: dict) -> float:
    """The follower rate of a start point back on the unit interval (rounding to two digits aside)."""
    low, high = np.log(1e-4), np.log(1e-2)
    return float((np.log(point["optim.follower_lr"]) - low) / (high - low))


def test_shifted_start_points_of_many_draws_spread_over_the_whole_unit_interval():
    """The first start point's follower rate over 400 draws is uniform on [0, 1] (Kolmogorov-Smirnov), every tenth
    of the interval reached, and the points of one draw stay evenly spread (a shifted Halton set)."""
    shifted = [_unit_follower(protocol.start_points(KNOBS, 4, protocol.sampler_seed(d), 0)[0]) for d in range(1, 401)]
    assert stats.kstest(shifted, "uniform").pvalue > 0.01
    assert np.histogram(shifted, bins=10, range=(0, 1))[0].min() > 15
    points = [_unit_follower(p) for p in protocol.start_points(KNOBS, 4, protocol.sampler_seed(3), 0)]
    assert sorted(np.floor(np.array(points) * 4).astype(int)) == [0, 1, 2, 3]


def test_the_shift_is_its_own_random_stream():
    """For one Halton scramble, the shift alone moves the points anywhere: over 400 re-tuning indices the first
    point is uniform, so a re-tuning (or a draw) never replays another's points, whatever the scramble did."""
    seed = protocol.sampler_seed(1)
    moved = [_unit_follower(protocol.start_points(KNOBS, 4, seed, r)[0]) for r in range(400)]
    assert stats.kstest(moved, "uniform").pvalue > 0.01
    shifts = np.array([protocol.rotation_shift(2, seed, r) for r in range(400)])
    assert abs(np.corrcoef(shifts[:, 0], shifts[:, 1])[0, 1]) < 0.15  # the knobs' shifts are independent too


def test_the_legacy_rule_keeps_the_points_committed_campaigns_were_tuned_with():
    unshifted = protocol.start_points(KNOBS, 3, protocol.sampler_seed(2))
    assert unshifted == protocol.start_points(KNOBS, 3, protocol.sampler_seed(2), None)
    assert unshifted != protocol.start_points(KNOBS, 3, protocol.sampler_seed(2), 0)


def test_a_retuning_samples_new_points_not_the_old_unit_points_replayed():
    first = protocol.start_points(KNOBS, 4, protocol.sampler_seed(1), 0)
    again = protocol.start_points(KNOBS, 4, protocol.sampler_seed(1), 1)
    assert [_unit_follower(p) for p in first] != pytest.approx([_unit_follower(p) for p in again], abs=0.02)


def test_a_study_started_under_the_legacy_rule_is_refused_under_the_new_one(tmp_path):
    study = tuning.open_study(tuning.storage_url(tmp_path), "s", epochs=9, prune=False, budget=6, knobs=KNOBS,
                              trial_seeds=[1000])
    tuning.enqueue_start(study, KNOBS, 6, protocol.sampler_seed(1), None)
    with pytest.raises(UserError, match="--legacy-tuning"):
        tuning.enqueue_start(study, KNOBS, 6, protocol.sampler_seed(1), 0)


def _args(*extra: str):
    from mtl_cog.cli import reproduce

    return reproduce.parse_args(["--scale", "overconfident", "--data", "fashion_mosaic", "--out", "out", *extra])


def test_final_seeds_differ_between_draws():
    from mtl_cog.cli import reproduce

    args = _args("--protocol", "fair", "--draws", "2")
    assert reproduce.final_seeds(args, 1) == [0, 1, 2, 3, 4] and reproduce.final_seeds(args, 2) == [5, 6, 7, 8, 9]
    legacy = _args("--protocol", "fair", "--draws", "2", "--seeds", "0", "1", "2", "--legacy-tuning")
    assert reproduce.final_seeds(legacy, 2) == [0, 1, 2]
    specs = reproduce.final_specs(_args("--protocol", "fair", "--draws", "2", "--method", "baseline"), None)
    assert [(s.labels.draw, s.labels.seed) for s in specs] == [("1", s) for s in range(5)] + [
        ("2", s) for s in range(5, 10)]


def test_tuning_seeds_among_a_later_draws_final_seeds_are_refused(tmp_path, monkeypatch):
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="share 7"):
        reproduce.main(["--protocol", "fair", "--draws", "2", "--tuning-seeds", "7", "--data", "digits",
                        "--method", "baseline", "--dry-run"])


@pytest.mark.parametrize("epochs, multitask, expected", [(300, False, 10), (100, True, 3), (30, False, 1),
                                                         (30, True, 1), (60, False, 2), (5, True, 1), (75, False, 3),
                                                         (150, True, 5)])
def test_the_papers_step_period_scaled_to_the_epochs(epochs, multitask, expected):
    assert protocol.paper_step_epochs(epochs, multitask) == expected


def test_paper_protocol_tunes_the_cog_variants_rates_only_and_fixes_the_rest():
    from mtl_cog.cli import reproduce

    args = _args("--protocol", "paper", "--draws", "2", "--budget", "8", "--method", "baseline", "ls", "cog_fc",
                 "cog_ls", "cog_ts")
    studies = reproduce.study_specs(args)
    assert sorted({m for _, m, _ in studies}) == ["cog_fc", "cog_ls", "cog_ts"]  # baseline and LS: not tuned
    for spec in studies.values():
        assert [k.key for k in spec.knobs] == ["optim.follower_lr", protocol.LEADER_RATIO_KEY]  # no smoothing knob
        assert spec.rotate and "optim.lr_step_epochs=1" in spec.overrides  # ÷10 every epoch at 30 epochs
        cfg = load_config(list(spec.config), list(spec.overrides))
        assert cfg.optim.lr_step_epochs == 1 and cfg.optim.lr_gamma == 0.1
        if spec.method == "cog_ls":
            assert cfg.method.label_smoothing == 0.1
    finals = {(s.labels.method, s.labels.draw, s.labels.seed): s for s in reproduce.final_specs(args, None)}
    assert len(finals) == 5 * 2 * 5
    for method in ("baseline", "ls"):
        cfg = load_config(list(finals[method, "2", 7].configs), finals[method, "2", 7].all_overrides())
        assert cfg.optim.follower_lr == 1e-4 and cfg.optim.lr_step_epochs == protocol.CONSTANT_RATE_EPOCHS
        assert cfg.seed == 7 and (method == "baseline" or cfg.method.label_smoothing == 0.1)
    # the fair protocol tunes every method, over the same knobs for the same loss (LS and COG+LS share a range)
    fair = reproduce.study_specs(_args("--protocol", "fair", "--method", "ls", "cog_ls"))
    ranges = {m: {k.key: (k.low, k.high) for k in s.knobs} for (_, m, _), s in fair.items()}
    assert ranges["ls"]["method.label_smoothing"] == ranges["cog_ls"]["method.label_smoothing"]


def test_a_retuning_is_offered_to_every_method_of_the_data_set_and_draw():
    from mtl_cog.cli import reproduce

    studies = reproduce.study_specs(_args("--protocol", "fair", "--draws", "2", "--method", "baseline", "cog_fc"))
    chosen = pd.DataFrame([{"dataset": "fashion_mosaic", "method": m, "draw": d,
                            "at_edge": "optim.follower_lr=highest" if (m, d) == ("cog_fc", "1") else ""}
                           for m in ("baseline", "cog_fc") for d in ("1", "2")])
    alike = study_rules.widen(studies, chosen, 1, alike=True)
    assert sorted(alike) == [("fashion_mosaic", "baseline", "1"), ("fashion_mosaic", "cog_fc", "1")]
    assert alike["fashion_mosaic", "baseline", "1"].knobs == studies["fashion_mosaic", "baseline", "1"].knobs
    assert alike["fashion_mosaic", "cog_fc", "1"].knobs[0].high == pytest.approx(0.1)  # ten times wider
    assert all(s.widening == 1 and s.rotation == 1 for s in alike.values())  # new points for both
    legacy = study_rules.widen(studies, chosen, 1, alike=False)
    assert sorted(legacy) == [("fashion_mosaic", "cog_fc", "1")]


def test_a_committed_campaign_tuned_under_the_legacy_rule_is_refused_without_the_flag_even_in_a_dry_run(capsys):
    from mtl_cog.cli import reproduce

    argv = ["--protocol", "fair", "--scale", "full", "--data", "fashion_mnist", "--method", "baseline", "ls", "cog_fc",
            "cog_ls", "cog_ts", "--budget", "6", "--draws", "2", "--seeds", "0", "1", "2", "--prune", "--dry-run",
            "--out", "results/fashion_mnist_full"]
    with pytest.raises(UserError, match="starts from trial 0 .* --legacy-tuning"):
        reproduce.main(argv)
    reproduce.main([*argv, "--legacy-tuning"])
    assert ("final runs: 30 planned (30 in the bundle, 0 finished outside it, 0 to resume, 0 to train)"
            in capsys.readouterr().out)


def test_the_plan_is_recorded_once_and_a_changed_plan_is_refused(tmp_path, monkeypatch):
    import subprocess

    from mtl_cog.bundles.bundle import Bundle
    from mtl_cog.experiments import preregistration

    def commit(*paths: str) -> None:  # a plan is evidence only when git holds it (tests/test_round6_plan.py)
        subprocess.run(["git", "add", *paths], check=True)
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "plan"],
                       check=True)

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MTL_COG_CODE_COMMIT", raising=False)
    subprocess.run(["git", "init", "-q"], check=True)
    plan = tmp_path / "plan.md"
    plan.write_text("H1: COG-FC beats the baseline\n")
    with pytest.raises(UserError, match="not committed"):  # in a checkout, an uncommitted plan is refused
        preregistration.plan_record(type(plan)("plan.md"), "abc")
    commit("plan.md")
    record = preregistration.plan_record(type(plan)("plan.md"), "abc123")
    assert record["path"] == "plan.md" and record["code_commit"] == "abc123" and len(record["sha256"]) == 64
    bundle = Bundle({"campaign": "c"})
    preregistration.check_plan(bundle, record)  # nothing recorded yet
    preregistration.keep_first(bundle, record)
    preregistration.keep_first(bundle, {**record, "code_commit": "later"})  # the first record stays
    assert bundle.campaign["plan"]["code_commit"] == "abc123"
    plan.write_text("H1: COG-FC beats the baseline, or else\n")  # edited after the campaign started
    commit("plan.md")
    with pytest.raises(UserError, match="has changed since the campaign started"):
        preregistration.check_plan(bundle, preregistration.plan_record(type(plan)("plan.md"), "def"))
    with pytest.raises(UserError, match="one campaign has one plan"):
        preregistration.check_plan(bundle, {**record, "path": "other.md"})
    for bad in ("missing.md", str(plan), "../plan.md"):
        with pytest.raises(UserError, match="--plan"):
            preregistration.plan_record(type(plan)(bad), "abc")
    (tmp_path / "empty.md").write_text("\n")
    (tmp_path / "link.md").symlink_to(plan)
    commit("empty.md", "link.md")
    for bad, message in (("empty.md", "is empty"), ("link.md", "not a link")):
        with pytest.raises(UserError, match=message):
            preregistration.plan_record(type(plan)(bad), "abc")
    late = Bundle({"campaign": "c"})
    late.runs = late.runs.reindex(range(3))  # a bundle that already holds three runs
    preregistration.keep_first(late, record)
    assert late.campaign["plan"]["runs_before"] == 3


def test_flags_that_would_do_nothing_or_the_wrong_thing_are_refused():
    from mtl_cog.cli import reproduce

    with pytest.raises(UserError, match="--legacy-tuning only resumes fair"):
        reproduce.parse_args(["--protocol", "paper", "--legacy-tuning", "--data", "digits"])
    with pytest.raises(UserError, match="--widen re-tunes studies"):
        reproduce.parse_args(["--protocol", "configs", "--widen", "--data", "digits"])


def test_the_paper_protocol_note_without_tuned_methods_says_nothing_of_the_configs_protocol(tmp_path):
    from mtl_cog.cli import reproduce
    from mtl_cog.cli.protocol_note import write_protocol_note

    args = reproduce.parse_args(["--protocol", "paper", "--data", "synthetic", "--method", "baseline", "ls"])
    write_protocol_note(tmp_path, args, None, [[0, 1, 2, 3, 4]])
    text = (tmp_path / "protocol.md").read_text()
    assert "COG paper's procedure" in text and "shipped config" not in text and "tuned for them" not in text


def test_a_two_stage_method_cannot_score_its_last_stage_one_epoch():
    from mtl_cog.config import load_config
    from mtl_cog.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.score_last_epoch"):
        load_config("configs/synthetic/tst.yaml", ["eval.score_last_epoch=true"])


def test_a_dry_run_refuses_a_train_size_the_run_would_refuse():
    from mtl_cog.config import load_config
    from mtl_cog.errors import ConfigError
    from mtl_cog.experiments import gpu_time

    with pytest.raises(ConfigError, match="data.train_size=97 is more than the 96"):
        gpu_time.estimate_run(load_config("configs/synthetic/baseline.yaml", ["data.synthetic.train_size=96",
                                                                              "data.train_size=97"]))
