"""Real launches of the entry points, as a user runs them (1 and 2 processes, gloo on the CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtl_cog.evaluation.predictions import load_predictions

# Every case here starts real processes, most of them trainings under a 1- and a 2-process launch:
# the slow suite. The fast suite covers the same entry points in process (test_robustness.py).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
# the README's launch lines: a shipped config gives every launcher value, --quiet keeps failures to one line
CONFIGS = {1: REPO / "configs" / "accelerate" / "default.yaml",
           2: REPO / "configs" / "accelerate" / "multi_process.yaml"}


def _launch(processes: int, script: str, *args: str) -> str:
    result = subprocess.run([*ACCELERATE, "--config_file", str(CONFIGS[processes]), "--quiet",
                             str(REPO / "scripts" / script), *args], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "values were not passed" not in result.stderr and "warn" not in result.stderr.lower(), result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    overrides = [f"output_dir={out}", "tracking=none", "train.epochs=2", "train.batch_size=32",
                 "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=5", "data.synthetic.train_size=96",
                 "data.synthetic.val_size=50", "data.synthetic.test_size=37"]
    folders = {}
    for processes in (1, 2):
        stdout = _launch(processes, "train_mtl.py", *overrides, f"run_name=p{processes}")
        folders[processes] = Path(stdout.strip().splitlines()[-1])  # the last line is the run folder
    return folders


@pytest.mark.parametrize("processes", [1, 2])
def test_run_folder_contents(runs, processes):
    run = runs[processes]
    assert run.name == f"p{processes}"
    for name in ("config.yaml", "metrics.jsonl", "test_metrics.csv", "best_model.safetensors",
                 "predictions_val.npz", "predictions_test.npz", "parameters.json"):
        assert (run / name).is_file(), name
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines[:2]] == [1, 2]
    assert {"ece@15", "rmsce@50", "mce@5", "brier"} <= set(lines[0]["val"])
    frame = pd.read_csv(run / "test_metrics.csv")
    assert list(frame["task"]) == [f"attr{t:02d}" for t in range(5)] + ["mean"]
    test = load_predictions(run / "predictions_test.npz")
    assert len(test) == 37 and test.task_names[0] == "attr00" and test.true_probs is not None
    assert len(load_predictions(run / "predictions_val.npz")) == 50  # nothing duplicated or dropped


def test_evaluation_agrees_between_one_and_two_processes(runs, tmp_path):
    outs = {}
    for processes in (1, 2):
        outs[processes] = tmp_path / f"eval{processes}.json"
        _launch(processes, "evaluate.py", "--run", str(runs[1]), "--split", "test", "--out", str(outs[processes]))
    one, two = (json.loads(outs[p].read_text()) for p in (1, 2))
    assert one.keys() == {"tasks", "mean", "multitask", "pairs"}  # a multi-task data set
    for metric, value in [*one["mean"].items(), *one["multitask"].items()]:
        assert {**two["mean"], **two["multitask"]}[metric] == pytest.approx(value, abs=1e-6), metric
    assert [(p["a"], p["b"]) for p in one["pairs"]] == [(p["a"], p["b"]) for p in two["pairs"]]
    # ... and equal to the test metrics the training run wrote
    frame = pd.read_csv(runs[1] / "test_metrics.csv").set_index("task")
    assert frame.loc["mean", "brier"] == pytest.approx(one["mean"]["brier"], abs=1e-6)


def test_evaluate_a_prediction_file(runs, tmp_path):
    out = tmp_path / "m.json"
    subprocess.run([sys.executable, "scripts/evaluate.py", "--predictions", str(runs[2] / "predictions_test.npz"),
                    "--bins", "5", "15", "--out", str(out)], cwd=REPO, check=True, capture_output=True)
    metrics = json.loads(out.read_text())
    assert set(metrics["mean"]) == {"accuracy", "nll", "brier", "ece@5", "ece@15", "rmsce@5", "rmsce@15",
                                    "mce@5", "mce@15", "smece", "adaece@5", "adaece@15", "brier_reliability",
                                    "brier_resolution", "brier_uncertainty"}
    assert {"pooled_ece@5", "worst_task_ece@15", "p90_task_ece@5", "count_ece", "pair_joint_ece"} <= set(
        metrics["multitask"])
    assert np.isclose(metrics["mean"]["accuracy"], pd.read_csv(runs[2] / "test_metrics.csv").iloc[-1]["accuracy"])


def test_user_error_is_one_line_without_traceback(tmp_path):
    result = subprocess.run([sys.executable, "scripts/train_mtl.py", "train.epochs=zero"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "error: train.epochs must be an integer" in result.stderr and "Traceback" not in result.stderr


def test_calibration_drift_script_reports_fitted_temperatures_sharpness_and_margins(tmp_path):
    result = subprocess.run([sys.executable, "scripts/calibration_drift.py",
                             "--config", "configs/synthetic/baseline.yaml", "--every", "1", "--curvature", "both",
                             "--curvature-batch", "32", "--curvature-iterations", "4", "train.epochs=2",
                             "model.backbone=cog_cnn_tiny", f"output_dir={tmp_path}",
                             "data.synthetic.train_size=96", "data.synthetic.num_attributes=3"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["epoch"] for line in lines] == [1, 2]
    assert lines[0]["tasks"] == 3 and lines[0]["fitted_T_median"] > 0 and "true_mean_abs_logit" in lines[0]
    for line in lines:
        assert line["ggn_top_eigenvalue"] > 0 and line["ggn_trace"] >= line["ggn_top_eigenvalue"] * 0.5
        assert line["val_margin_q01"] <= line["val_margin_q50"] <= line["val_margin_q99"]
        assert 0 <= line["val_smece"] <= 1 and "val_count_ece" in line and "val_pooled_ece@15" in line
    (run_dir,) = tmp_path.iterdir()
    written = [json.loads(line) for line in (run_dir / "calibration_drift.jsonl").read_text().splitlines()]
    assert written == lines and (run_dir / "calibration_drift.png").stat().st_size > 10_000
