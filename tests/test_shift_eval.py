"""Scoring under shift: rows of shift_metrics.csv, post-hoc fitted once on clean validation, the CLI's refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mtl_cog.cli import evaluate
from mtl_cog.config import load_config
from mtl_cog.errors import ConfigError, UserError
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.evaluation.shift import CLEAN, calibrated_under_shift, shift_frame, summary
from mtl_cog.runs import rundir


def _predictions(seed, n=300, scale=1.0):
    rng = np.random.default_rng(seed)
    z = [rng.normal(0, 2, n) * scale, rng.normal(0, 2, (n, 3)) * scale]
    y = [(rng.random(n) < 1 / (1 + np.exp(-z[0] / 2))).astype(np.int64), rng.integers(0, 3, n)]
    return Predictions(["a", "b"], z, y)


def test_posthoc_is_fitted_once_on_clean_validation_and_applied_to_every_split():
    val, clean, shifted = _predictions(0), _predictions(1), _predictions(2, scale=3.0)
    together = calibrated_under_shift("ts", val, [clean, shifted])
    for alone, joint in zip((calibrate("ts", val, clean), calibrate("ts", val, shifted)), together):
        for z1, z2 in zip(alone.logits, joint.logits):
            np.testing.assert_allclose(z1, z2, rtol=1e-9, atol=1e-12)


def test_rows_and_the_clean_row_equal_the_plain_scores():
    val, clean = _predictions(0), _predictions(1)
    shifted = {("fog", 1): _predictions(2, scale=2.0), ("fog", 3): _predictions(3, scale=3.0)}
    frame = shift_frame(clean, shifted, [15], val, ["ts"])
    assert len(frame) == 2 * 3 * 3  # methods x (clean + 2 splits) x (2 tasks + mean)
    row = frame[(frame.method == "none") & (frame.corruption == CLEAN) & (frame.task == "mean")].iloc[0]
    assert row.severity == 0 and row["ece@15"] == pytest.approx(score(clean, [15])["mean"]["ece@15"], abs=1e-15)
    curves = summary(frame)
    assert list(curves.severity[curves.method == "none"]) == [0, 1, 3]
    assert frame.columns[0] == "suite" and set(frame.suite) == {"cifar10c"}  # whose severities, on every row
    assert set(shift_frame(clean, shifted, [15], suite="imagenetc").suite) == {"imagenetc"}


def test_cli_refuses_unknown_corruptions_severities_and_misplaced_flags(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean gaussian_noise"):
        evaluate.main(["--run", str(tmp_path), "--shift", "gausian_noise"])
    with pytest.raises(UserError, match="1..5"):
        evaluate.parse_severities("0-5")
    with pytest.raises(UserError, match="1..5"):
        evaluate.parse_severities("6")
    with pytest.raises(UserError, match="range like 1-5"):
        evaluate.parse_severities("one")
    assert evaluate.parse_severities("1-5") == [1, 2, 3, 4, 5] and evaluate.parse_severities("1,3") == [1, 3]
    with pytest.raises(UserError, match="--shift needs --run"):
        evaluate.main(["--predictions", str(tmp_path / "p.npz"), "--shift"])
    with pytest.raises(ConfigError, match="eval.shift: unknown corruption 'smoke'"):
        load_config(None, ["eval.shift=[smoke]"])
    with pytest.raises(ConfigError, match="eval.shift_severities"):
        load_config(None, ["eval.shift_severities=[0]"])
    with pytest.raises(ConfigError, match="eval.shift_suite"):
        load_config(None, ["eval.shift_suite=cifar100c"])
    with pytest.raises(UserError, match="--suite go with --shift"):
        evaluate.main(["--run", str(tmp_path), "--suite", "cifar10c", "--out", str(tmp_path / "m.json")])


@pytest.mark.slow  # trains a tiny run, then corrupts its test split
def test_training_with_groups_and_shift_writes_both_tables(tmp_path, tiny_overrides):
    from mtl_cog.training import fit

    cfg = load_config(None, [*tiny_overrides, "run_name=r", f"data.root={tmp_path}", "eval.groups=[attr00]",
                             "eval.shift=[fog]", "eval.shift_severities=[2]", "eval.shift_posthoc=[ts]",
                             "eval.shift_workers=1"])
    result = fit(cfg)
    run = result.run_dir
    shift_rows = pd.read_csv(run / rundir.SHIFT_METRICS)
    test = pd.read_csv(run / rundir.TEST_METRICS)
    clean = shift_rows[(shift_rows.method == "none") & (shift_rows.severity == 0) & (shift_rows.task == "mean")]
    assert clean["ece@15"].iloc[0] == pytest.approx(test[test.task == "mean"]["ece@15"].iloc[0], abs=1e-12)
    assert set(shift_rows.method) == {"none", "ts"} and set(shift_rows.severity) == {0, 2}
    groups = pd.read_csv(run / rundir.GROUP_METRICS)
    assert set(groups.group) == {"attr00"} and "attr00" not in set(groups.task)
    assert "multicalibration_smece" in test.columns and (run / rundir.SHIFT_PNG).is_file()
    assert (run / rundir.RISK_COVERAGE_PNG).is_file()
    with pytest.raises(ConfigError, match="'attr0' is not a task of this data set. Did you mean attr0"):
        fit(load_config(None, [*tiny_overrides, "run_name=r2", f"data.root={tmp_path}", "eval.groups=[attr0]"]))
    assert not (run.parent / "r2").exists()  # refused before the run folder is made


def test_evaluate_groups_on_a_prediction_file(tmp_path):
    from mtl_cog.evaluation.predictions import save_predictions

    rng = np.random.default_rng(0)
    z = [rng.normal(size=200) for _ in range(3)]
    y = [rng.integers(0, 2, 200) for _ in range(3)]
    save_predictions(tmp_path / "p.npz", Predictions(["Male", "Young", "Hat"], z, y))
    with pytest.raises(ConfigError, match="--groups: 'Mal' is not a task of this data set. Did you mean Male"):
        evaluate.main(["--predictions", str(tmp_path / "p.npz"), "--groups", "Mal", "--out", str(tmp_path / "m.json")])
    assert not (tmp_path / "m.json").exists()
    metrics = evaluate.main(["--predictions", str(tmp_path / "p.npz"), "--groups", "Male", "--out",
                             str(tmp_path / "m.json")])
    assert {c["task"] for c in metrics["groups"]["cells"]} == {"Young", "Hat"}
    assert "multicalibration_smece" in metrics["mean"] and "multicalibration_smece" in metrics["tasks"]["Hat"]
