"""The fair protocol: tuning settings, paired bootstrap differences, rank spread, convergence, time estimates."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtl_cog.analysis.paired import counterpart_pairs, paired_differences, rank_spread, seed_t_interval, verdict
from mtl_cog.bundles.trajectories import at_identity, calibrator_table, convergence
from mtl_cog.config import load_config
from mtl_cog.errors import UserError
from mtl_cog.experiments import gpu_time, protocol
from mtl_cog.experiments.sweep import validation_scores

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------ t interval


def test_constant_differences_give_a_zero_width_interval():
    mean, low, high = seed_t_interval(np.full((3, 40), -0.02))
    assert mean == low == high == pytest.approx(-0.02)


def test_three_seeds_one_task_give_the_textbook_t_interval():
    # mean 2, sd 1, t(2, 0.975) = 4.30265: 2 ± 4.30265 / sqrt(3) = 2 ± 2.48414
    mean, low, high = seed_t_interval(np.array([[1.0], [2.0], [3.0]]))
    assert mean == 2.0 and low == pytest.approx(2 - 2.48414, abs=1e-5) and high == pytest.approx(2 + 2.48414, abs=1e-5)


def test_tasks_are_averaged_within_a_seed_before_the_interval():
    # fixed task effects cancel into the estimand; only seed-to-seed variation widens the interval
    tasks_only = np.tile(np.linspace(-1, 1, 10), (3, 1)) + 0.5
    assert seed_t_interval(tasks_only) == pytest.approx((0.5, 0.5, 0.5))
    seeds_only = np.tile(np.array([[-1.0], [0.0], [1.0]]), (1, 10))
    _, low, high = seed_t_interval(seeds_only)
    assert low == pytest.approx(-4.3027 / math.sqrt(3), abs=1e-4) and high == -low


def test_one_seed_has_no_interval_and_no_verdict():
    mean, low, high = seed_t_interval(np.array([[0.3, 0.1]]))
    assert mean == pytest.approx(0.2) and math.isnan(low) and math.isnan(high)
    assert verdict(mean, low, high, lower_better=True) == "inconclusive"


@pytest.mark.parametrize(("mean", "low", "high", "lower_better", "expected"), [
    (-0.1, -0.2, -0.05, True, "variant"), (-0.1, -0.2, -0.05, False, "counterpart"),
    (0.1, 0.05, 0.2, True, "counterpart"), (0.1, 0.05, 0.2, False, "variant"),
    (0.1, -0.05, 0.2, True, "inconclusive"), (0.0, 0.0, 0.0, True, "inconclusive")])
def test_verdict_names_the_side_the_interval_excludes_zero_for(mean, low, high, lower_better, expected):
    assert verdict(mean, low, high, lower_better) == expected


@pytest.mark.parametrize("bad", [np.zeros((0, 3)), np.zeros(4), np.array([[np.nan, 1.0]])])
def test_interval_refuses_empty_flat_or_nan_input(bad):
    with pytest.raises(ValueError):
        seed_t_interval(bad)


def _scores(rows):
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "run", "task", "accuracy", "nll", "brier",
                                       "ece@15"])


def test_paired_differences_pair_seeds_and_tasks_and_say_who_is_better():
    rows = []
    for seed in (0, 1, 2):
        for task in ("a", "b"):
            base = 0.5 + 0.1 * seed  # seed effects cancel in the pairing
            rows.append(["ds", "baseline", seed, "r", task, 0.8, base, 0.2, 0.10])
            rows.append(["ds", "cog_fc", seed, "r", task, 0.8, base - 0.05, 0.2, 0.04 + 0.01 * seed])
        rows.append(["ds", "baseline", seed, "r", "mean", 0.8, 0.5, 0.2, 0.1])  # task means are not pairs
    rows.append(["ds", "tst", 0, "r", "a", 0.8, 0.5, 0.2, 0.1])  # cog_tst absent: no row for it
    table = paired_differences(_scores(rows), {"cog_fc": "baseline", "cog_tst": "tst"}).set_index("metric")
    assert set(table["variant"]) == {"cog_fc"}
    assert table.loc["nll", "mean_difference"] == pytest.approx(-0.05)
    assert table.loc["nll", "ci_low"] == pytest.approx(-0.05) and table.loc["nll", "ci_high"] == pytest.approx(-0.05)
    assert table.loc["nll", "better"] == "variant" and table.loc["ece@15", "better"] == "variant"
    # ECE differences -0.06, -0.05, -0.04: -0.05 ± 4.3027 * 0.01 / sqrt(3)
    assert table.loc["ece@15", "ci_high"] == pytest.approx(-0.05 + 4.3027 * 0.01 / math.sqrt(3), abs=1e-5)
    assert table.loc["accuracy", "better"] == "inconclusive"  # identical: the interval is [0, 0]
    assert table.loc["nll", "n_seeds"] == 3 and table.loc["nll", "n_tasks"] == 2
    one_seed = paired_differences(_scores([r for r in rows if r[2] == 0]), {"cog_fc": "baseline"})
    assert one_seed["ci_low"].isna().all() and set(one_seed["better"]) == {"inconclusive"}


def test_counterparts_come_from_the_method_configs():
    configs = {m: load_config(REPO / "configs" / "digits" / f"{m}.yaml").to_dict()
               for m in ("baseline", "cog_ts", "cog_vs", "cog_ms", "cog_tst", "cog_fc", "cog_ls", "ls", "tst")}
    assert counterpart_pairs(configs) == {"cog_ts": "baseline+ts", "cog_vs": "baseline+vs", "cog_ms": "baseline+ms",
                                          "cog_tst": "tst", "cog_fc": "baseline", "cog_ls": "ls"}


def test_rank_spread_over_seeds_known_answer():
    rows = []
    # seed 0: a beats b on all three metrics; seed 1: b beats a on all three
    for seed, (good, bad) in enumerate((("a", "b"), ("b", "a"))):
        rows.append(["ds", good, seed, "r", "mean", 0.9, 0.3, 0.1, 0.0])
        rows.append(["ds", bad, seed, "r", "mean", 0.8, 0.4, 0.2, 0.0])
    spread = rank_spread(_scores(rows)).set_index("method")
    assert spread.loc["a", "avg_rank_mean"] == 1.5 and spread.loc["a", "avg_rank_min"] == 1.0
    assert spread.loc["a", "avg_rank_max"] == 2.0 and spread.loc["a", "avg_rank_std"] == pytest.approx(math.sqrt(0.5))
    assert spread.loc["b", "n_seeds"] == 2


# ------------------------------------------------------------------------------------------ tuning plan


def test_every_method_gets_the_budget_over_its_knobs():
    digits = {m: load_config(REPO / "configs" / "digits" / f"{m}.yaml") for m in ("baseline", "cog_ts", "cog_ls",
                                                                                  "focal", "tst")}
    settings = {m: protocol.trial_settings(protocol.search_space(cfg, 1e-3), 5) for m, cfg in digits.items()}
    assert all(len(s) == 5 for s in settings.values())
    assert set(settings["baseline"][0]) == {"optim.follower_lr"}
    assert set(settings["tst"][0]) == {"optim.follower_lr", "two_stage.lr"}  # stage two's rate: TST's own knob
    assert all(1e-4 <= t["two_stage.lr"] <= 1e-2 for t in settings["tst"])
    assert set(settings["cog_ts"][0]) == {"optim.follower_lr", "optim.leader_lr"}
    assert set(settings["cog_ls"][0]) == {"optim.follower_lr", "optim.leader_lr", "method.label_smoothing"}
    assert set(settings["focal"][0]) == {"optim.follower_lr", "method.focal_gamma"}
    # the same follower rates for every method, inside [f0/10, 10 f0]; the leader never faster
    followers = {m: [t["optim.follower_lr"] for t in s] for m, s in settings.items()}
    assert all(v == followers["baseline"] for v in followers.values())
    assert all(1e-4 <= f <= 1e-2 for f in followers["baseline"]) and len(set(followers["baseline"])) == 5
    assert all(t["optim.leader_lr"] <= t["optim.follower_lr"] for t in settings["cog_ts"])
    assert all(0.02 <= t["method.label_smoothing"] <= 0.2 for t in settings["cog_ls"])
    for setting in settings["cog_ls"]:  # every setting is a valid config
        load_config(REPO / "configs" / "digits" / "cog_ls.yaml", protocol.as_overrides(setting))
    with pytest.raises(UserError, match="budget"):
        protocol.trial_settings(protocol.search_space(digits["baseline"], 1e-3), 0)


def test_every_loss_knob_is_a_real_key_of_every_config_with_that_loss_and_every_counterpart_exists():
    shipped = {path.stem: load_config(path) for path in sorted((REPO / "configs" / "digits").glob("*.yaml"))}
    tuned_losses = set()
    for method, cfg in shipped.items():
        space = protocol.search_space(cfg, 1e-3)
        own = [knob for knob in space if knob.key.startswith("method.")]
        if cfg.method.loss in protocol.LOSS_KNOBS:
            tuned_losses.add(cfg.method.loss)
            assert len(own) == 1, method
        for setting in protocol.trial_settings(space, 4):  # each point is a valid config of that method
            tuned = load_config(REPO / "configs" / "digits" / f"{method}.yaml", protocol.as_overrides(setting))
            for key, value in setting.items():
                section, name = key.split(".")
                assert getattr(getattr(tuned, section), name) == pytest.approx(value), (method, key)
        counterpart = cfg.method.counterpart
        if counterpart:  # "baseline+ts" names a post-hoc calibrator on the baseline
            assert counterpart.split("+")[0] in shipped, (method, counterpart)
    assert tuned_losses == set(protocol.LOSS_KNOBS)  # no knob for a loss no config uses
    assert {shipped[m].method.counterpart for m in ("cog_mbls", "cog_fedlas", "cog_margin", "cog_list")} == {
        "mbls", "fedlas", "margin", "list"}


def test_a_choice_in_the_outer_share_of_its_range_is_at_the_edge():
    knobs = [protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True),
             protocol.Knob("leader_ratio", 1e-3, 1.0, log=True),
             protocol.Knob("method.label_smoothing", 0.02, 0.2, log=False)]
    # log scale: 9e-3 is 97.7 % of the way from 1e-4 to 1e-2; ratio 1 is the top (no hierarchy)
    assert protocol.range_edges(knobs, {"optim.follower_lr": 9e-3, "leader_ratio": 1.0,
                                        "method.label_smoothing": 0.1}) == ["optim.follower_lr=highest",
                                                                            "leader_ratio=highest"]
    assert protocol.range_edges(knobs, {"optim.follower_lr": 1e-3, "leader_ratio": 1.2e-3,
                                        "method.label_smoothing": 0.025}) == ["leader_ratio=lowest",
                                                                              "method.label_smoothing=lowest"]
    assert protocol.range_edges(knobs, {"optim.follower_lr": 1e-3, "leader_ratio": 0.03}) == []


def test_ratio_one_resolves_to_the_follower_rate_and_is_allowed():
    setting = protocol.resolve({"optim.follower_lr": 2e-3, "leader_ratio": 1.0})
    assert setting == {"optim.follower_lr": 2e-3, "optim.leader_lr": 2e-3}
    overrides = protocol.as_overrides(setting)
    assert overrides[-1] == "optim.allow_leader_lr_geq_follower=true"
    cfg = load_config(REPO / "configs" / "digits" / "cog_fc.yaml", overrides)
    assert cfg.optim.leader_lr == cfg.optim.follower_lr
    assert "allow" not in " ".join(protocol.as_overrides(protocol.resolve({"optim.follower_lr": 2e-3,
                                                                           "leader_ratio": 0.1})))


# ------------------------------------------------------------------------------------------ convergence


def write_metrics(run: Path, nlls: list[float], temperatures: list[float] | None, at_identity_flag=None) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for epoch, nll in enumerate(nlls, start=1):
        line = {"epoch": epoch, "train_loss": nll, "val": {"nll": nll, "accuracy": 0.9}}
        if temperatures is not None:
            line["calibrator"] = {"summary": {}, "tasks": {"temperature": {"a": temperatures[epoch - 1],
                                                                           "b": 1 + (temperatures[epoch - 1] - 1) / 2}}}
        lines.append(line)
    final = {"epoch": len(nlls) + 1, "final": True}
    if at_identity_flag is not None:
        final["calibrator_at_identity"] = at_identity_flag
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in [*lines, final]) + "\n")
    return run


def test_convergence_sees_a_falling_nll_and_a_moving_calibrator(tmp_path):
    settled = write_metrics(tmp_path / "a", [1.0, 0.7, 0.6, 0.55, 0.55, 0.55, 0.55, 0.56, 0.55, 0.55],
                            [1.0, 1.2, 1.3, 1.35, 1.36, 1.36, 1.36, 1.36, 1.36, 1.36])
    result = convergence(settled)
    assert result.converged and result.nll_gain_last == 0.0 and result.calibrator_move_last == 0.0
    falling = write_metrics(tmp_path / "b", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1], None)
    result = convergence(falling)
    assert not result.converged and result.nll_gain_last == pytest.approx((0.3 - 0.1) / 0.3)
    assert "validation NLL still fell" in result.why_not()
    moving = write_metrics(tmp_path / "c", [0.5] * 10, [1.0 + 0.1 * e for e in range(10)])
    result = convergence(moving)
    assert not result.converged and result.calibrator_move_last == pytest.approx(2 / 9)
    assert convergence(write_metrics(tmp_path / "d", [0.5, 0.4], None)) is None  # too short to judge


def test_convergence_judges_a_second_stage_too(tmp_path):
    def two_stage(run: Path, stage_two_nll: list[float]) -> Path:
        write_metrics(run, [1.0, 0.6] + [0.5] * 8, None)  # stage one settled
        lines = [{"epoch": e, "train_loss": v, "val_nll": v, "best": True} for e, v in enumerate(stage_two_nll, 1)]
        (run / "two_stage_metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json (torn)")
        return run

    still_learning = convergence(two_stage(tmp_path / "a", [2.3 - 0.1 * e for e in range(10)]))
    assert still_learning.nll_gain_last == 0.0 and not still_learning.converged
    assert still_learning.stage_two_nll_gain_last == pytest.approx((1.6 - 1.4) / 1.6)  # best of the first 8 of 10: 1.6
    assert "stage two's validation NLL still fell" in still_learning.why_not()
    settled = convergence(two_stage(tmp_path / "b", [2.3, 1.0, 0.8] + [0.7] * 7))
    assert settled.converged and settled.stage_two_nll_gain_last == 0.0
    assert convergence(write_metrics(tmp_path / "c", [0.5] * 10, None)).stage_two_nll_gain_last is None


def test_calibrator_table_and_the_identity_flag(tmp_path):
    stuck = write_metrics(tmp_path / "stuck", [0.5] * 6, [1.0, 0.999, 1.001, 1.0, 1.002, 1.001])
    moved = write_metrics(tmp_path / "moved", [0.5] * 6, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], at_identity_flag=False)
    assert at_identity(stuck) is True  # no final flag (older run): recomputed from the last epoch
    assert at_identity(moved) is False
    table = calibrator_table([("ds", "cog_ts", 0, stuck), ("ds", "cog_ts", 1, moved)]).set_index(["seed", "task"])
    assert table.loc[(1, "a"), "last_epoch_value"] == 1.5 and table.loc[(1, "b"), "last_epoch_value"] == 1.25
    assert table.loc[(1, "a"), "first_epoch_value"] == 1.0 and bool(table.loc[(0, "a"), "calibrator_at_identity"])


# ------------------------------------------------------------------------------------------ time estimates


def test_estimate_known_answer_from_stated_defaults():
    cfg = load_config(REPO / "configs" / "cifar10" / "baseline.yaml", ["train.precision=bf16"])
    estimate = gpu_time.estimate_run(cfg)
    rate = gpu_time.DEFAULT_GPU_RATES[(32, True)]
    images = 300 * (40_000 / rate + 10_000 / (3 * rate)) + 20_000 / (3 * rate)
    scoring = (300 + 2) * 1 * gpu_time.SCORE_SECONDS_PER_TASK  # 300 validations + the final two, one task
    assert estimate.sizes == {"train": 40_000, "val": 10_000, "test": 10_000}
    assert estimate.seconds == pytest.approx(gpu_time.START_SECONDS + images + scoring)
    assert "not measured" in estimate.source
    fp32 = gpu_time.estimate_run(load_config(REPO / "configs" / "cifar10" / "baseline.yaml"))
    assert fp32.seconds == pytest.approx(gpu_time.START_SECONDS + 2 * images + scoring)


def test_cpu_estimate_counts_tasks_and_the_second_stage():
    cfg = load_config(REPO / "configs" / "synthetic" / "tst.yaml",
                      ["model.backbone=cog_cnn_tiny", "data.image_size=16", "train.epochs=40",
                       "data.synthetic.train_size=1000", "data.synthetic.val_size=200"])
    rate = gpu_time.CPU_TINY_RATE
    images = 40 * (1000 + 200 / 3) / rate + (200 + cfg.data.synthetic.test_size) / (3 * rate)
    images += cfg.two_stage.epochs * 1200 / (3 * rate)
    scoring = (40 + 2 + cfg.two_stage.epochs) * cfg.data.synthetic.num_attributes * gpu_time.SCORE_SECONDS_PER_TASK
    estimate = gpu_time.estimate_run(cfg)
    assert estimate.seconds == pytest.approx(gpu_time.CPU_START_SECONDS + images + scoring)
    assert "CPU core" in estimate.source


def test_a_gpu_check_measurement_replaces_the_defaults_and_scales_with_pixels(tmp_path):
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"images_per_s": 10_000.0, "backbone": "resnet101", "image_size": 32,
                                "precision": "bf16", "device": "NVIDIA H200"}))
    measured = gpu_time.read_gpu_check(path)
    cfg = load_config(REPO / "configs" / "celeba" / "cog_fc.yaml", ["train.precision=bf16", "data.image_size=64",
                                                                    "train.epochs=1"])
    rate, source, _ = gpu_time.training_rate(cfg, measured)
    assert rate == pytest.approx(2_500.0) and "H200" in source and "pixel count" in source
    # benchmark.py's other layout: images_per_s as a mapping with "value"
    path.write_text(json.dumps({"images_per_s": {"value": 500.0, "backbone": "resnet101", "image_size": 32}}))
    assert gpu_time.read_gpu_check(path).images_per_s == 500.0


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"images_per_s": -1, "backbone": "r", "image_size": 32}', '{"images_per_s": 100}',
    '{"images_per_s": NaN, "backbone": "r", "image_size": 32}'])
def test_an_unusable_gpu_check_is_ignored_or_refused_when_named(tmp_path, content):
    path = tmp_path / "gpu_check.json"
    path.write_text(content)
    assert gpu_time.read_gpu_check(path) is None
    with pytest.raises(UserError, match="gpu_check.sh"):
        gpu_time.find_gpu_check(path, tmp_path)


def test_paper_grid_dry_run_lists_every_run_and_sums_the_estimates(capsys, tmp_path, monkeypatch):
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    reproduce.main(["--scale", "paper", "--dry-run", "--out", "out"])
    text = capsys.readouterr().out
    methods = {d: len(list((REPO / "configs" / d).glob("*.yaml"))) for d in ("celeba", "svhn", "cifar10", "cifar100")}
    assert f"final runs: {5 * sum(methods.values())} planned" in text  # 5 seeds by default, the paper's count
    assert f"celeba: {methods['celeba']} methods × 5 seeds" in text
    total, measured = 0.0, gpu_time.find_gpu_check(None, REPO)  # with the benchmarks in results/benchmarks/
    for dataset in ("celeba", "svhn", "cifar10", "cifar100"):
        for config in sorted((REPO / "configs" / dataset).glob("*.yaml")):
            total += 5 * gpu_time.estimate_run(load_config(config), measured).seconds
    assert f"estimated: {total / 3600:.1f} GPU-hours (~{gpu_time.format_duration(total)} of one device)" in text
    assert not (tmp_path / "out").exists()


def test_fair_dry_run_plans_tuning_then_seeds(capsys, tmp_path, monkeypatch):
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    reproduce.main(["--protocol", "fair", "--dry-run", "--budget", "3", "--method", "baseline", "cog_ts",
                    "--data", "digits", "--out", "out"])
    text = capsys.readouterr().out
    assert "tuning: 2 studies × 3 trials, 6 still to run" in text and "final runs: 10 planned" in text
    assert "with --prune" in text  # the dry run gives the time with and without pruning
    assert "tune digits/cog_ts: 3 trials of optim.follower_lr [0.0001, 0.01], leader_ratio [0.001, 1]" in text
    assert "estimated: 0." in text and "CPU core-hours" in text and not (tmp_path / "out").exists()


def test_a_fair_dry_run_counts_a_started_final_run_it_cannot_compare_yet(capsys, tmp_path, monkeypatch):
    """Finals run with tuned settings the dry run does not know (choosing writes): an interrupted one is counted."""
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out/runs/digits-baseline-seed0").mkdir(parents=True)
    (tmp_path / "out/runs/digits-baseline-seed0/config.yaml").write_text("optim: {follower_lr: 0.000825938}\n")
    reproduce.main(["--protocol", "fair", "--dry-run", "--budget", "3", "--method", "baseline", "--data", "digits",
                    "--seeds", "0", "1", "--out", "out"])
    assert ("final runs: 2 planned (0 in the bundle, 0 finished outside it, 1 to resume, 1 to train)"
            in capsys.readouterr().out)


def test_the_old_option_spellings_work_with_one_deprecation_line(capsys, tmp_path, monkeypatch):
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    reproduce.main(["--protocol", "fair", "--dry-run", "--methods", "baseline", "--datasets", "digits", "--out", "o"])
    captured = capsys.readouterr()
    assert captured.err.count("deprecated") == 2 and "use --data" in captured.err and "use --method" in captured.err
    assert "tune digits/baseline" in captured.out


@pytest.mark.parametrize("extra, message", [
    (["--tuning-seeds", "1000", "1"], "--tuning-seeds and --seeds share 1 "),  # evaluated on a seed it was chosen on
    (["--tuning-seeds", "1000", "1001", "--prune"], "--prune with 2 --tuning-seeds"),  # pruned on one seed's epochs
    (["--tuning-seeds", "1000", "1000"], "--tuning-seeds"),  # a repeat
    (["--tuning-seeds", "0", "--draws", "2", "--seeds", "100"], "share 100 "),  # draw 2 trains with seed 0 + 100
])
def test_tuning_seeds_that_would_mislead_are_refused_before_anything_is_written(tmp_path, monkeypatch, extra, message):
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message):
        reproduce.main(["--protocol", "fair", "--budget", "2", "--seeds", "0", "1", *extra,
                        "--data", "digits", "--method", "baseline", "--out", "out"])
    assert not (tmp_path / "out").exists()


def test_train_dry_run_writes_nothing(capsys, tmp_path, monkeypatch):
    from mtl_cog.cli import train

    monkeypatch.chdir(tmp_path)
    train.main(["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), "--dry-run", "train.epochs=7"])
    text = capsys.readouterr().out
    assert "train 7 epochs" in text and "data sizes train/val/test 1,000/200/2,000" in text
    assert "estimated time:" in text and "nothing written" in text
    assert list(tmp_path.iterdir()) == []


def test_per_class_and_matrix_calibrators_are_read_too(tmp_path):
    from mtl_cog.bundles.trajectories import calibrator_trajectory

    run = tmp_path / "ms"
    run.mkdir()
    line = {"epoch": 1, "val": {"nll": 0.5}, "calibrator": {"summary": {}, "tasks": {
        "matrix": {"digit": [[1.2, 0.1], [0.0, 0.8]], "attr": [[1.5]]}, "bias": {"digit": [0.1, -0.1], "attr": 0.2}}}}
    (run / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    table = calibrator_trajectory(run).set_index(["parameter", "task"])["value"]
    assert table[("matrix (diagonal)", "digit[0]")] == 1.2 and table[("matrix (diagonal)", "digit[1]")] == 0.8
    assert table[("matrix", "attr")] == 1.5 and table[("bias", "digit[1]")] == -0.1 and table[("bias", "attr")] == 0.2


# ------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow  # trainings in subprocesses (the local launcher, 2 jobs)
def test_fair_protocol_end_to_end_tunes_chooses_pairs_and_reuses(tmp_path, monkeypatch, capsys):
    """Tiny but real: 2 trials per method, 2 seeds, 2 epochs; then the same command reuses every run."""
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    argv = ["--protocol", "fair", "--budget", "2", "--seeds", "0", "1", "--epochs", "2", "--data", "digits",
            "--method", "baseline", "cog_fc", "--posthoc-on", "baseline", "--out", "out", "--jobs", "2",
            "--tuning-seeds", "7", "8"]
    report = reproduce.main(argv)
    chosen = pd.read_csv(report / "chosen_settings.csv", keep_default_na=False)
    assert sorted(chosen["method"]) == ["baseline", "cog_fc"] and set(chosen["trials"]) == {2}
    assert "at_edge" in chosen.columns and set(chosen["epoch_share"]) == {1.0}  # no pruning: every epoch
    assert (tmp_path / "out" / "tuning" / "optuna.db").is_file()  # the studies, for optuna-dashboard
    all_trials = pd.read_csv(tmp_path / "out" / "bundle" / "trials.csv", keep_default_na=False)
    for method in ("baseline", "cog_fc"):
        trials = all_trials[all_trials["study"] == f"digits-{method}"]
        assert list(trials["chosen"]).count("*") == 1 and trials["val_nll"].notna().all()
        assert set(trials["state"]) == {"complete"}
        assert sorted(trials["run"]) == ["trial_00-seed7 trial_00-seed8", "trial_01-seed7 trial_01-seed8"]
        for row in trials.itertuples():  # a trial's value: the mean of its runs' validation NLL
            runs = [tmp_path / "out" / "tuning" / f"digits-{method}" / name for name in row.run.split()]
            assert row.val_nll == pytest.approx(sum(validation_scores(r, [15])["nll"] for r in runs) / 2)
    # the two start points: the same follower rates for both methods
    rates = [all_trials.loc[all_trials["study"] == f"digits-{m}", "optim.follower_lr"].tolist()
             for m in ("baseline", "cog_fc")]
    assert rates[0] == rates[1]
    # the chosen setting is what the final runs trained with
    row = chosen.set_index("method").loc["cog_fc"]
    final = load_config(tmp_path / "out" / "runs" / "digits-cog_fc-seed1" / "config.yaml")
    for override in row["settings"].split():
        key, value = override.split("=")
        section, name = key.split(".")
        expected = True if value == "true" else pytest.approx(float(value))
        assert getattr(getattr(final, section), name) == expected
    paired = pd.read_csv(report / "paired.csv")
    pair = paired[(paired["variant"] == "cog_fc") & (paired["counterpart"] == "baseline")]
    assert set(pair["metric"]) >= {"nll", "brier", "accuracy"}
    assert (pair["ci_low"] <= pair["mean_difference"]).all() and (pair["mean_difference"] <= pair["ci_high"]).all()
    assert "Optuna study of 2 trials (each trial trained with seed(s) 7 8, valued by the mean;" in \
        (report / "protocol.md").read_text()
    assert set(chosen["tuning_seeds"]) == {"7 8"}  # --tuning-seeds took effect: the trials trained with them
    for seed in (7, 8):
        assert load_config(tmp_path / "out" / "tuning" / "digits-baseline" / f"trial_00-seed{seed}" /
                           "config.yaml").seed == seed
    capsys.readouterr()
    reproduce.main(argv)  # nothing left to train: every run is reused
    out = capsys.readouterr().out
    assert "2 already complete, 0 worker(s) to run" in out
    assert "final runs: 4 planned (4 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in out


def test_only_list_is_marked_as_fitting_on_validation():
    marked = {path.stem for path in sorted((REPO / "configs" / "digits").glob("*.yaml"))
              if protocol.fits_on_validation(load_config(path))}
    assert marked == {"list"}  # COG-LiST leads L by gradient on training data
