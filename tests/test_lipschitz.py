"""LiST: the Lipschitz network's bound is sound, L acts exactly as an inverse temperature, the L update
follows its rule, certified radii have known answers, and a LiST run reports certified accuracy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mtl_cog.cli import evaluate, list_front, train
from mtl_cog.config import MethodConfig, ModelConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.robustness import add_certified_accuracy, certified_radii, metric_name
from mtl_cog.models.calibrators import CALIBRATORS, fit_temperatures
from mtl_cog.models.lipschitz import ListScale, network_lipschitz
from mtl_cog.models.network import build_network
from mtl_cog.runs import rundir

LAYOUT = LogitLayout((2, 2, 10))
LIST = MethodConfig(name="list", calibrator="list", leader=[], loss="margin_ce", list_init=5.0, list_rate=0.5)
LIPSCHITZ_MODEL = ModelConfig(backbone="cog_lipschitz_tiny", head="lipschitz")


def _list_network(seed: int = 0):
    torch.manual_seed(seed)
    return build_network(LIPSCHITZ_MODEL, LIST, LAYOUT)


def test_the_reported_bound_is_sound_and_about_one_for_the_unscaled_map():
    network = _list_network().eval()
    bound = network.backbone.lipschitz_constant() * network.heads.lipschitz_constant()
    assert torch.all(bound < 1.1)  # 1-Lipschitz up to power iteration's small under-estimate
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 16, 16, generator=g)
    x2 = x + 0.1 * torch.randn(64, 3, 16, 16, generator=g)
    with torch.no_grad():
        z, z2 = network.heads(network.backbone(x)), network.heads(network.backbone(x2))
    distance = (x - x2).flatten(1).norm(dim=1)
    for t in range(LAYOUT.num_tasks):
        block = LAYOUT.task_slice(t)
        assert torch.all((z[:, block] - z2[:, block]).norm(dim=1) <= bound[t] * distance + 1e-5)
    assert torch.allclose(network_lipschitz(network), 5.0 * bound)  # L times the unscaled map's bound


def test_reading_the_bound_in_training_mode_does_not_change_the_network():
    network = _list_network().train()
    x = torch.randn(4, 3, 16, 16)
    network.eval()
    before = network(x)
    network.train()
    for _ in range(3):
        network_lipschitz(network)  # no power-iteration step may happen here
    network.eval()
    assert torch.equal(network(x), before)


def test_scaling_l_by_c_is_temperature_scaling_by_one_over_c():
    network = _list_network().eval()
    x = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        before = network(x)
        network.calibrator.log_lipschitz.add_(math.log(3.0))
        after = network(x)
    temperature = CALIBRATORS.get("temperature")(LAYOUT)
    with torch.no_grad():
        temperature.log_temperature.fill_(math.log(1 / 3.0))
        assert torch.allclose(after, temperature(before), rtol=1e-5, atol=1e-6)
    assert torch.allclose(network.calibrator.lipschitz, torch.full((3,), 15.0))


def _calibrated_predictions(scale: float, n: int = 4000) -> Predictions:
    """Labels drawn from the probabilities of logits h; the predictions hold ``scale * h``."""
    rng = np.random.default_rng(0)
    h_bin = rng.normal(0, 2, (n, 2))
    y_bin = (rng.random((n, 2)) < 1 / (1 + np.exp(-h_bin))).astype(np.int64)
    h_mc = rng.normal(0, 2, (n, 10))
    p = np.exp(h_mc) / np.exp(h_mc).sum(1, keepdims=True)
    y_mc = np.array([rng.choice(10, p=row) for row in p])
    return Predictions(["a", "b", "c"], [scale * h_bin[:, 0], scale * h_bin[:, 1], scale * h_mc],
                       [y_bin[:, 0], y_bin[:, 1], y_mc])


def test_list_update_moves_l_toward_the_calibrated_scale_at_its_rate():
    predictions = _calibrated_predictions(scale=3.0)  # over-confident by a factor 3: T* = 3 for every task
    temperatures = fit_temperatures(LAYOUT, predictions.logits, predictions.labels)
    assert torch.allclose(temperatures, torch.full((3,), 3.0, dtype=torch.float64), rtol=0.08)
    scale = ListScale(LAYOUT, init=6.0, rate=0.5)
    scale.on_validation_end(predictions)
    assert torch.allclose(scale.lipschitz.double(), 6.0 * temperatures ** -0.5, rtol=1e-5)
    jump = ListScale(LAYOUT, init=6.0, rate=1.0)
    jump.on_validation_end(predictions)  # rate 1: straight to L / T, where these logits are calibrated
    assert torch.allclose(jump.lipschitz.double(), 6.0 / temperatures, rtol=1e-5)
    frozen = ListScale(LAYOUT, init=6.0, rate=0.0)
    frozen.on_validation_end(predictions)
    assert torch.equal(frozen.lipschitz, torch.full((3,), 6.0))
    assert not list(scale.parameters())  # LiST's L is not trained by gradient; cog_list's is
    assert [n for n, _ in CALIBRATORS.get("lipschitz_scale")(LAYOUT).named_parameters()] == ["log_lipschitz"]


def test_list_update_survives_a_separable_validation_task():
    predictions = _calibrated_predictions(scale=1.0, n=50)
    predictions.labels[0] = (predictions.logits[0] > 0).astype(np.int64)  # perfectly separable: T -> 0
    scale = ListScale(LAYOUT, init=6.0, rate=1.0)
    scale.on_validation_end(predictions)
    assert torch.isfinite(scale.lipschitz).all() and scale.lipschitz[0] <= 6.0 * math.exp(3) + 1e-3


def test_certified_radius_of_hand_built_one_lipschitz_models():
    # binary: z = w.x + b with |w| = 1 is 1-Lipschitz; the radius is |z|, and it is exact
    w, b = np.array([0.6, 0.8]), 0.1
    x = np.array([[1.0, 1.0], [-2.0, 0.5], [0.0, -1.0]])
    z = x @ w + b  # 1.5, -0.7, -0.7
    labels = np.array([1, 0, 1])  # the third is wrong: radius 0
    radii = certified_radii(Predictions(["t"], [z], [labels]), np.array([1.0]))[0]
    assert radii == pytest.approx([1.5, 0.7, 0.0])
    for point, zi, r in zip(x[:2], z[:2], radii[:2]):
        toward = -np.sign(zi) * w  # the shortest way to the decision boundary
        assert np.sign((point + (r - 1e-6) * toward) @ w + b) == np.sign(zi)
        assert np.sign((point + (r + 1e-6) * toward) @ w + b) != np.sign(zi)
    # 2 classes as a K-class task, rows e1 and -e1: ||W|| = sqrt(2), the margin 2 x_1, so the bound
    # m / (sqrt(2) L) = x_1 is exactly the distance to the boundary x_1 = 0
    weight = np.array([[1.0, 0.0], [-1.0, 0.0]])
    points = np.array([[0.7, 5.0], [2.0, -3.0]])
    radii = certified_radii(Predictions(["k"], [points @ weight.T], [np.array([0, 0])]),
                            np.array([np.linalg.norm(weight, 2)]))[0]
    assert radii == pytest.approx([0.7, 2.0])


def test_certified_accuracy_counts_correct_samples_beyond_eps_in_pixel_scale():
    predictions = Predictions(["t"], [np.array([2.0, 0.5, -3.0, 1.0])], [np.array([1, 1, 0, 0])])
    metrics = {"tasks": {"t": {"accuracy": 0.75}}, "mean": {"accuracy": 0.75}}
    # bound 2 w.r.t. normalised input, std 0.5: 4 w.r.t. pixels; radii 0.5, 0.125, 0.75, 0 (wrong)
    add_certified_accuracy(metrics, predictions, np.array([2.0]), [0.1, 0.5, 1.0], (0.5, 0.6, 0.7))
    assert [metrics["tasks"]["t"][metric_name(e)] for e in (0.1, 0.5, 1.0)] == [0.75, 0.5, 0.0]
    assert metrics["mean"][metric_name(0.5)] == 0.5


def test_list_refuses_a_network_without_a_lipschitz_bound():
    with pytest.raises(ConfigError, match="model.backbone.*cog_lipschitz"):
        build_network(ModelConfig(backbone="cog_cnn_tiny", head="lipschitz"), LIST, LAYOUT)
    with pytest.raises(ConfigError, match="model.head"):
        build_network(ModelConfig(backbone="cog_lipschitz_tiny", head="linear"), LIST, LAYOUT)
    assert network_lipschitz(build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(), LAYOUT)) is None


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_list_run_reports_certified_accuracy_and_takes_stability_scaling(tmp_path, tiny_overrides):
    run = train.main(["--config", "configs/synthetic/list.yaml", *tiny_overrides, "run_name=list",
                      "model.backbone=cog_lipschitz_tiny", "train.epochs=1", "data.image_size=16"])
    frame = pd.read_csv(run / rundir.TEST_METRICS)
    cert = [c for c in frame.columns if c.startswith("cert_acc@")]
    assert cert == [metric_name(36 / 255), metric_name(72 / 255)]
    assert (frame[cert[0]] <= frame["accuracy"] + 1e-12).all() and (frame[cert[1]] <= frame[cert[0]]).all()
    results = evaluate.main(["--run", str(run), "--posthoc", "ts", "stability"])
    assert set(results) == {"none", "ts", "stability"}
    posthoc = pd.read_csv(run / rundir.POSTHOC_METRICS)
    assert set(posthoc["method"]) == {"none", "ts", "stability"}
    assert (run / rundir.posthoc_predictions_file("test", "stability")).is_file()
    # post hoc does not change the predicted classes
    assert results["stability"]["mean"]["accuracy"] == results["none"]["mean"]["accuracy"]
    # the front: certified accuracy recomputed at any radius from the predictions and the bound
    out = list_front.main([str(run.parent), "--out", str(tmp_path / "front"), "--eps", str(36 / 255)])
    front = pd.read_csv(out / "list_front.csv")
    assert front[metric_name(36 / 255)].iloc[0] == pytest.approx(frame[cert[0]].iloc[-1])  # = the run's own figure
    assert (out / "list_front_synthetic.png").stat().st_size > 0
