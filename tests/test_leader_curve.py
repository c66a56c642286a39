"""The leader-rate curve: its grid, its runs' overrides, its table and intervals, and ratio 1 = the baseline."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtl_cog.analysis.leader_curve import best_ratio, curve_table, paired_to_reference
from mtl_cog.config import load_config
from mtl_cog.errors import UserError
from mtl_cog.experiments import leader_curve as curve
from mtl_cog.reporting.curve_figures import curve_figure

REPO = Path(__file__).resolve().parents[1]


def test_the_default_grid_is_logarithmic_from_1e_3_to_1_inclusive():
    assert curve.RATIOS[0] == 1e-3 and curve.RATIOS[-1] == 1.0
    steps = np.diff(np.log10(curve.RATIOS))
    assert np.all(steps > 0.4) and np.all(steps < 0.6)  # 1, 3 per decade


@pytest.mark.parametrize("bad", [[0.0], [1.5], [float("nan")], [-0.1, 0.1], []])
def test_ratios_outside_0_1_are_refused(bad):
    with pytest.raises(UserError, match="--ratios"):
        curve.check_ratios(bad)


def test_ratios_are_sorted_and_distinct():
    assert curve.check_ratios([1, 0.01, 0.01, 0.1]) == [0.01, 0.1, 1]


def test_ratios_that_would_share_a_folder_name_are_refused():
    with pytest.raises(UserError, match="share the folder name r0.1"):
        curve.check_ratios([0.1, 0.1000001])
    assert curve.check_ratios([0.1, 0.100001]) == [0.1, 0.100001]  # 6 digits apart: two folders


def test_ratio_one_sets_the_leader_to_the_follower_rate_and_lifts_the_refusal():
    overrides = curve.curve_overrides(3e-3, 1.0)
    cfg = load_config(REPO / "configs" / "digits" / "cog_fc.yaml", overrides)
    assert cfg.optim.leader_lr == cfg.optim.follower_lr == 3e-3
    assert curve.ALLOW_EQUAL not in curve.curve_overrides(3e-3, 0.1)
    cfg = load_config(REPO / "configs" / "digits" / "cog_fc.yaml", curve.curve_overrides(3e-3, 0.01))
    assert cfg.optim.leader_lr == pytest.approx(3e-5) and not cfg.optim.allow_leader_lr_geq_follower


def test_the_plan_has_every_ratio_and_seed_and_the_references(tmp_path):
    refs = {"baseline": ((Path("b.yaml"),), ()), "ls": ((Path("ls.yaml"),), ("method.label_smoothing=0.05",))}
    runs = curve.plan("cog_ls", "digits", ((Path("c.yaml"),), ("optim.follower_lr=0.002",)), refs, 1e-3, [0.01, 1.0],
                      [0, 1], tmp_path, ["train.epochs=2"], shared_rate=False)
    names = sorted(r.run_dir.name for r in runs)
    assert names == sorted(["cog_ls-r0.01-seed0", "cog_ls-r0.01-seed1", "cog_ls-r1-seed0", "cog_ls-r1-seed1",
                            "baseline-seed0", "baseline-seed1", "ls-seed0", "ls-seed1"])
    assert all("train.epochs=2" in r.overrides for r in runs)  # the user's after the tuned ones; the curve's win
    assert [r.overrides[0] for r in runs if r.labels.method == "ls"] == ["method.label_smoothing=0.05"] * 2
    assert all("method.label_smoothing=0.05" not in r.overrides for r in runs if r.labels.method != "ls")
    assert {r.labels.ratio for r in runs if r.labels.method == "baseline"} == {None}
    assert [r.posthoc for r in runs if r.labels.method == "baseline"] == [("ts",), ("ts",)]


def test_a_protocol_folder_without_the_method_is_refused(tmp_path):
    with pytest.raises(UserError, match="no final run of digits/cog_fc"):
        curve.protocol_run_source(tmp_path, "digits", "cog_fc")
    (tmp_path / "runs" / "digits-cog_fc-seed3").mkdir(parents=True)
    (tmp_path / "runs" / "digits-cog_fc-seed3" / "config.yaml").write_text("seed: 3\n")
    configs, overrides = curve.protocol_run_source(tmp_path, "digits", "cog_fc")
    assert configs[0].parent.name == "digits-cog_fc-seed3" and overrides == ()


def test_a_protocol_known_only_from_its_bundle_gives_the_tuned_settings(tmp_path):
    """A fresh clone: the protocol's run folders are gone, its committed bundle records each final run's spec."""
    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.experiments import campaign

    config = REPO / "configs" / "digits" / "cog_fc.yaml"
    spec = campaign.RunSpec("digits-cog_fc-seed0", (config,), ("seed=0", "optim.follower_lr=0.002", "tracking=none"),
                            tmp_path / "runs" / "digits-cog_fc-seed0",
                            campaign.Labels("digits", "cog_fc", "final", 0, "1"))
    planned = campaign.plan(campaign.Campaign("reproduce-fair-cpu", tmp_path, [spec]))
    row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": spec.run, "campaign": "reproduce-fair-cpu", "data": "digits",
                                                   "method": "cog_fc", "role": "final", "draw": "1", "seed": 0,
                                                   "status": "done", "config_digest": planned[0].digest}
    collector = campaign.Collector(campaign.Campaign("reproduce-fair-cpu", tmp_path, [spec], command=["x"]), planned)
    results = pd.DataFrame([{"run": spec.run, "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
    collector.update(lambda b: b.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS)))
    configs, overrides = curve.protocol_run_source(tmp_path, "digits", "cog_fc")
    assert configs == (config,) and overrides == ("optim.follower_lr=0.002",)  # seed and tracking are the curve's


def _scores():
    """cog_fc at ratios 0.1 and 1 (3 seeds, 2 tasks) and the baseline; ratio 1 equals the baseline."""
    rows = []
    for seed in range(3):
        for task, offset in (("a", 0.0), ("b", 0.2)):
            base = 0.5 + 0.1 * seed + offset
            for arm, ratio, nll in (("baseline", None, base), ("cog_fc", 1.0, base), ("cog_fc", 0.1, base - 0.05)):
                for split in ("val", "test"):
                    rows.append({"arm": arm, "ratio": ratio, "seed": seed, "split": split, "task": task, "nll": nll,
                                 "brier": 0.2, "ece@15": 0.1, "smece": 0.1, "accuracy": 0.9})
    return pd.DataFrame(rows)


def test_curve_table_is_the_mean_of_task_means_with_a_t_interval_over_seeds():
    table = curve_table(_scores()).set_index(["arm", "metric"])
    base = table.loc[("baseline", "nll")]
    # task means per seed 0.6, 0.7, 0.8: mean 0.7, sd 0.1, t(2) = 4.30265
    assert base["mean"] == pytest.approx(0.7) and math.isnan(base["ratio"])
    assert base["ci_high"] - base["mean"] == pytest.approx(4.30265 * 0.1 / math.sqrt(3), abs=1e-5)
    assert base["n_seeds"] == 3 and base["n_tasks"] == 2


def test_paired_differences_per_ratio_and_the_best_ratio_on_validation():
    paired = paired_to_reference(_scores(), "cog_fc", "baseline", [0.1, 1.0]).set_index(["ratio", "metric"])
    assert paired.loc[(1.0, "nll"), "mean_difference"] == 0 and paired.loc[(1.0, "nll"), "better"] == "inconclusive"
    assert paired.loc[(0.1, "nll"), "mean_difference"] == pytest.approx(-0.05)
    assert paired.loc[(0.1, "nll"), "better"] == "variant"  # the same -0.05 on every seed: a zero-width interval
    best, per_ratio = best_ratio(_scores(), "cog_fc")
    assert best == 0.1 and per_ratio[1.0] == pytest.approx(0.7)


def test_each_ratio_against_the_method_at_ratio_one():
    """No hierarchy at the same follower rate is the reference that isolates the hierarchy."""
    scores = _scores()
    scores.loc[(scores["arm"] == "baseline"), "nll"] += 0.3  # a counterpart tuned elsewhere: another level
    paired = paired_to_reference(scores, "cog_fc", "cog_fc", [0.1], reference_ratio=1.0).set_index("metric")
    assert paired.loc["nll", "mean_difference"] == pytest.approx(-0.05) and paired.loc["nll", "reference"] == "cog_fc@1"
    assert set(paired["ratio"]) == {0.1}


def test_the_figure_draws_one_panel_per_metric():
    figure = curve_figure(curve_table(_scores()), "cog_fc", "t")
    assert len(figure.axes) == 5 and figure.axes[0].get_xscale() == "log"


def test_a_method_without_a_leader_is_refused():
    from mtl_cog.cli import leader_curve

    with pytest.raises(UserError, match="has no leader"):
        leader_curve.main(["--config", str(REPO / "configs" / "digits" / "baseline.yaml"), "--dry-run"])


def test_dry_run_lists_the_runs_and_writes_nothing(tmp_path, capsys):
    from mtl_cog.cli import leader_curve

    out = tmp_path / "curve"
    leader_curve.main(["--config", str(REPO / "configs" / "digits" / "cog_ls.yaml"), "--ratios", "0.01", "1",
                       "--seeds", "0", "1", "--dry-run", "--out", str(out)])
    text = capsys.readouterr().out
    assert "plus baseline, ls" in text
    assert "8 planned (0 in the bundle, 0 finished outside it, 0 to resume, 8 to train)" in text
    assert not out.exists()


@pytest.mark.slow
def test_cog_fc_at_ratio_one_is_the_baseline_exactly(tmp_path, monkeypatch, capsys):
    """No hierarchy, no difference: Adam is elementwise, so two groups at one rate are one group."""
    from mtl_cog.cli import leader_curve
    from mtl_cog.evaluation.predictions import load_predictions

    monkeypatch.chdir(tmp_path)
    argv = ["--config", str(REPO / "configs" / "synthetic" / "cog_fc.yaml"), "--ratios", "1", "--seeds", "0",
            "--follower-lr", "4e-3", "--out", "curve", "train.epochs=2", "data.synthetic.train_size=200",
            "data.synthetic.val_size=100", "data.synthetic.test_size=100", "model.backbone=cog_cnn_tiny",
            "data.image_size=16"]
    leader_curve.main(argv)
    runs = tmp_path / "curve" / "runs"
    mine = load_predictions(runs / "cog_fc-r1-seed0" / "predictions_test.npz")
    theirs = load_predictions(runs / "baseline-seed0" / "predictions_test.npz")
    for a, b in zip(mine.logits, theirs.logits):
        np.testing.assert_array_equal(a, b)
    paired = pd.read_csv(tmp_path / "curve" / "paired.csv")
    assert (paired["mean_difference"] == 0).all() and len(paired) == 5
    assert (tmp_path / "curve" / "curve.png").is_file()
    capsys.readouterr()
    leader_curve.main(argv)  # again: every run reused
    assert "2 planned (2 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in capsys.readouterr().out


@pytest.mark.slow
def test_the_curve_through_the_slurm_launcher(tmp_path, monkeypatch, capsys, submitit_local):
    """--launcher slurm's path (submitit's local executor stands in for sbatch): every run trains
    as a job, the curve is written, and the same command again reuses every run."""
    from mtl_cog.cli import leader_curve

    monkeypatch.chdir(tmp_path)
    argv = ["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), "--ratios", "0.1", "--seeds", "0",
            "--follower-lr", "4e-3", "--out", "curve", "--launcher", "slurm", "train.epochs=1",
            "data.synthetic.train_size=100", "data.synthetic.val_size=50", "data.synthetic.test_size=50",
            "model.backbone=cog_cnn_tiny", "data.image_size=16"]
    leader_curve.main(argv, executor=submitit_local)
    assert "2 planned (0 in the bundle, 0 finished outside it, 0 to resume, 2 to train)" in capsys.readouterr().out
    curve_csv = pd.read_csv(tmp_path / "curve" / "curve.csv")
    assert set(curve_csv["arm"]) >= {"cog_ts", "baseline", "baseline+ts"}
    assert np.isfinite(curve_csv["mean"]).all()
    leader_curve.main(argv, executor=submitit_local)
    assert "2 planned (2 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in capsys.readouterr().out


def test_without_the_reference_there_is_no_paired_row():
    scores = _scores()
    assert paired_to_reference(scores[scores["arm"] != "baseline"], "cog_fc", "baseline", [0.1, 1.0]).empty


@pytest.mark.slow
def test_a_curve_after_the_protocol_records_its_reference_runs_instead_of_training_them(tmp_path, monkeypatch,
                                                                                         capsys):
    """The baseline band of a curve drawn from a fair protocol is the protocol's draw-1 final run (the same config
    digest): recorded from the protocol's bundle with its numbers, labelled as the curve's, never trained again."""
    import json

    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.cli import leader_curve, reproduce
    from mtl_cog.reporting.bundle_report import bundle_tables

    monkeypatch.chdir(tmp_path)
    reproduce.main(["--protocol", "fair", "--budget", "1", "--seeds", "0", "--epochs", "2", "--data", "digits",
                    "--method", "baseline", "cog_fc", "--jobs", "1", "--threads", "1", "--out", "proto"])
    capsys.readouterr()
    argv = ["--config", str(REPO / "configs" / "digits" / "cog_fc.yaml"), "--protocol-dir", str(tmp_path / "proto"),
            "--ratios", "0.1", "--seeds", "0", "--threads", "1", "--out", "curve"]
    leader_curve.main([*argv, "--dry-run"])
    dry = capsys.readouterr().out
    assert "1 reference run(s) are the protocol's final runs" in dry and "would be recorded" in dry
    assert "2 planned (1 in the bundle, 0 finished outside it, 0 to resume, 1 to train)" in dry  # one left to train
    leader_curve.main(argv)
    out = capsys.readouterr().out
    assert "are recorded from its bundle, not trained again (digits-baseline-seed0)" in out
    assert "2 planned (1 in the bundle, 0 finished outside it, 0 to resume, 1 to train)" in out
    assert not (tmp_path / "curve" / "runs" / "baseline-seed0").exists()
    curve_bundle = bundles.read_bundle(tmp_path / "curve" / "bundle")
    proto_bundle = bundles.read_bundle(tmp_path / "proto" / "bundle")
    assert json.loads((tmp_path / "curve" / "bundle" / "campaign.json").read_text())["reused"] == {
        "baseline-seed0": {"campaign": proto_bundle.name, "run": "digits-baseline-seed0"}}
    row = curve_bundle.runs.set_index("run").loc["baseline-seed0"]
    assert (row["role"], str(row["draw"]), row["campaign"]) == ("curve", "1", curve_bundle.name)
    assert str(curve_bundle.runs.set_index("run").loc["cog_fc-r0.1-seed0", "draw"]) == "1"

    def values(bundle, run, split):
        frame = bundle.results[(bundle.results["run"] == run) & (bundle.results["split"] == split)]
        return frame.drop(columns="run").sort_values(["task", "metric"]).reset_index(drop=True)
    for split in ("val", "test", "test+ts"):
        pd.testing.assert_frame_equal(values(curve_bundle, "baseline-seed0", split),
                                      values(proto_bundle, "digits-baseline-seed0", split))
    assert set(curve_bundle.results.loc[curve_bundle.results["run"] == "baseline-seed0", "split"]) <= {
        "val", "test", "test+ts", "calibrator"}  # the protocol's other post-hoc calibrators stay behind
    scope = bundle_tables(curve_bundle)["scope"].iloc[0]
    assert (scope["done"], scope["reused"]) == (2, 1)
    leader_curve.main(argv)  # again: nothing to train, nothing recorded twice
    assert "2 planned (2 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in capsys.readouterr().out
    assert len(bundles.read_bundle(tmp_path / "curve" / "bundle").runs) == 2


def _reference_plan(tmp_path, seed=0):
    """A planned (not started) baseline reference run of a digits curve, and a protocol bundle whose draw-1 final
    run is its twin (same settings and seed, 1 thread, this environment's versions)."""
    from mtl_cog.bundles import bundle as bundles
    from mtl_cog.bundles.bundle_rows import environment, versions_text
    from mtl_cog.experiments import campaign

    config = REPO / "configs" / "digits" / "baseline.yaml"
    spec = campaign.RunSpec(f"baseline-seed{seed}", (config,), (f"seed={seed}", "tracking=none"),
                            tmp_path / "curve" / "runs" / f"baseline-seed{seed}",
                            campaign.Labels("digits", "baseline", "curve", seed, "1"), posthoc=("ts",))
    planned = campaign.plan(campaign.Campaign("leader-curve-digits-cog_fc", tmp_path / "curve", [spec]))
    twin = f"digits-baseline-seed{seed}"
    protocol = bundles.Bundle({"format": bundles.FORMAT, "campaign": "reproduce-fair-cpu", "counterparts": {},
                               "specs": {twin: {"setting": campaign.setting_digest(planned[0].config)}}})
    row = {c: "" for c in bundles.RUN_COLUMNS} | {
        "run": twin, "campaign": "reproduce-fair-cpu", "data": "digits", "method": "baseline", "role": "final",
        "draw": "1", "seed": seed, "status": "done", "config_digest": "x", "threads": "1",
        "versions": versions_text(environment())}
    results = pd.DataFrame([{"run": twin, "split": split, "task": "mean", "metric": "nll", "value": 0.3}
                            for split in ("val", "test", "test+ts", "test+vs")])
    protocol.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    return planned, protocol


def test_a_reference_run_is_reused_only_from_its_true_twin(tmp_path):
    """Same data set, settings, seed, threads and versions, a draw-1 final with the post-hoc splits the band needs,
    and a curve run not started yet: anything else is trained by the curve itself."""
    planned, protocol = _reference_plan(tmp_path)
    assert curve.protocol_matches(planned, protocol, threads=1) == {"baseline-seed0": "digits-baseline-seed0"}
    assert curve.protocol_matches(planned, protocol, threads=2) == {}  # another thread count: other numbers
    assert curve.protocol_matches(planned, None, threads=1) == {}
    for column, value in (("draw", "2"), ("data", "synthetic"), ("seed", 1), ("versions", "torch=0"),
                          ("status", "failed"), ("role", "trial")):
        other = _reference_plan(tmp_path)[1]
        other.runs.loc[0, column] = value
        assert curve.protocol_matches(planned, other, threads=1) == {}, column
    no_ts = _reference_plan(tmp_path)[1]
    no_ts.results = no_ts.results[no_ts.results["split"] != "test+ts"]
    assert curve.protocol_matches(planned, no_ts, threads=1) == {}  # the baseline+ts band would be missing
    planned[0].state = "done"  # finished in its folder already: its own numbers are collected, never replaced
    assert curve.protocol_matches(planned, protocol, threads=1) == {}


def test_a_damaged_protocol_bundle_means_training_not_a_crash(tmp_path, capsys):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "campaign.json").write_text("{not json")
    assert curve.read_protocol_bundle(tmp_path) is None
    assert "the reference runs are trained here instead" in capsys.readouterr().err


def test_a_curve_bundle_from_before_draw_labels_still_refuses_another_setting(tmp_path):
    """Curve runs now carry their source's draw ("1"); rows recorded before with draw "" are the same arm, so a
    rerun under other settings is still refused instead of averaged with them."""
    from test_campaign import record_as_done

    from mtl_cog.experiments import campaign

    config = REPO / "configs" / "digits" / "cog_fc.yaml"

    def spec(seed, draw, epochs):
        name = f"cog_fc-r0.1-seed{seed}"
        return campaign.RunSpec(name, (config,), (f"seed={seed}", f"train.epochs={epochs}"), tmp_path / name,
                                campaign.Labels("digits", "cog_fc", "curve", seed, draw, ratio=0.1))
    record_as_done(campaign.Campaign("c", tmp_path, [spec(0, "", 1)], command=["x"]))  # recorded before labels
    with pytest.raises(UserError, match="another setting"):
        campaign.plan(campaign.Campaign("c", tmp_path, [spec(1, "1", 2)]))
    assert campaign.plan(campaign.Campaign("c", tmp_path, [spec(1, "1", 1)]))[0].state == "new"
