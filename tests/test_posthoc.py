"""Post-hoc calibration: planted temperatures are recovered (post hoc and by COG-TS on a frozen
network), every method runs on binary and multi-class tasks, and evaluate.py --posthoc writes its rows."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from mtl_cog.config import Config, MethodConfig, OptimConfig, save_config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError, UserError
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.posthoc import POSTHOC_METHODS, calibrate, fit_calibrator
from mtl_cog.evaluation.predictions import Predictions, load_predictions, save_predictions
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.network import Network
from mtl_cog.objectives import CrossEntropy
from mtl_cog.training.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]

def _evaluate_script():
    return importlib.import_module("mtl_cog.cli.evaluate")


PLANTED = (2.5, 0.6)  # binary task overconfident (T > 1), 5-class task underconfident (T < 1)


def _planted(n: int, seed: int) -> tuple[Predictions, np.ndarray]:
    """Labels drawn from calibrated logits z; the saved logits are z * T_t (so T_t recovers z)."""
    rng = np.random.default_rng(seed)
    zb = rng.normal(0, 2, n)
    yb = (rng.random(n) < 1 / (1 + np.exp(-zb))).astype(np.int64)
    zm = rng.normal(0, 2, (n, 5))
    p = np.exp(zm) / np.exp(zm).sum(1, keepdims=True)
    ym = (rng.random((n, 1)) > p.cumsum(1)).sum(1)
    logits = [(zb * PLANTED[0]).astype(np.float32), (zm * PLANTED[1]).astype(np.float32)]
    return Predictions(["bin", "multi"], logits, [yb, ym]), np.concatenate([zb[:, None], zm], 1)


def test_posthoc_temperature_scaling_recovers_the_planted_temperatures():
    val, _ = _planted(20000, seed=0)
    layout = LogitLayout((2, 5))
    calibrator = CALIBRATORS.get("temperature")(layout).double()
    logits = torch.as_tensor(layout.join(val.logits), dtype=torch.float64)
    labels = torch.as_tensor(np.stack(val.labels, 1))
    fit_calibrator(calibrator, logits, labels, layout)
    assert calibrator.temperature.detach().numpy() == pytest.approx(PLANTED, rel=0.05)
    test, true_z = _planted(2000, seed=1)
    out = calibrate("ts", val, test)
    assert out.logits[0] == pytest.approx(true_z[:, 0], rel=0.06, abs=0.02)


def test_cog_ts_on_a_frozen_network_recovers_the_planted_temperatures():
    """The COG update with a follower that cannot move: only the leader (temperatures) learns."""
    train, _ = _planted(8000, seed=2)
    layout = LogitLayout((2, 5))
    planted_logits = torch.as_tensor(layout.join(train.logits))
    labels = torch.as_tensor(np.stack(train.labels, 1))
    frozen = nn.Identity()  # the "network" outputs the planted logits themselves
    network = Network(frozen, nn.Identity(), CALIBRATORS.get("temperature")(layout))
    optimizer = build_optimizer(network, ["calibrator"], OptimConfig(follower_lr=1e-3, leader_lr=0.05))
    objective = CrossEntropy(layout, MethodConfig())
    g = torch.Generator().manual_seed(0)
    for _epoch in range(6):
        for idx in torch.randperm(len(labels), generator=g).split(256):
            loss = objective(network(planted_logits[idx]), labels[idx]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert network.calibrator.temperature.detach().numpy() == pytest.approx(PLANTED, rel=0.1)


@pytest.mark.parametrize("method", POSTHOC_METHODS)
def test_every_posthoc_method_improves_a_miscalibrated_model(method):
    val, _ = _planted(3000, seed=3)
    test, _ = _planted(3000, seed=4)
    before = compute_metrics(test.task_names, test.logits, test.labels, [15])["tasks"]
    out = calibrate(method, val, test)
    assert out.logits[0].shape == test.logits[0].shape and out.logits[1].shape == test.logits[1].shape
    assert all(np.isfinite(z).all() for z in out.logits)
    after = compute_metrics(out.task_names, out.logits, out.labels, [15])["tasks"]
    for task in ("bin", "multi"):
        assert after[task]["ece@15"] < before[task]["ece@15"], task
    if method in ("ts", "vs", "ms", "svs", "sms"):  # the parametric ones also improve NLL
        assert after["bin"]["nll"] < before["bin"]["nll"]


def test_unknown_posthoc_method_is_refused():
    val, _ = _planted(50, seed=0)
    with pytest.raises(PosthocError, match="platt"):
        calibrate("platt", val, val)


def test_evaluate_posthoc_writes_rows_and_calibrated_predictions(tmp_path):
    val, _ = _planted(600, seed=5)
    test, _ = _planted(400, seed=6)
    save_config(Config(), tmp_path / "config.yaml")
    save_predictions(tmp_path / "predictions_val.npz", val)
    save_predictions(tmp_path / "predictions_test.npz", test)
    _evaluate_script().main(["--run", str(tmp_path), "--posthoc", "ts", "sms", "histogram"])
    frame = pd.read_csv(tmp_path / "posthoc_metrics.csv")
    assert list(frame["method"].unique()) == ["none", "ts", "sms", "histogram"]
    assert list(frame[frame.method == "ts"]["task"]) == ["bin", "multi", "mean"]
    none = frame[(frame.method == "none") & (frame.task == "mean")].iloc[0]
    ts = frame[(frame.method == "ts") & (frame.task == "mean")].iloc[0]
    assert ts["nll"] < none["nll"] and ts["accuracy"] == pytest.approx(none["accuracy"])
    calibrated = load_predictions(tmp_path / "predictions_test_ts.npz")
    assert len(calibrated) == 400 and calibrated.task_names == ["bin", "multi"]


def test_evaluate_posthoc_without_run_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--posthoc needs --run"):
        _evaluate_script().main(["--predictions", str(tmp_path / "x.npz"), "--posthoc", "ts"])
