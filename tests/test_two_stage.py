"""TST / V-TST (mtl_cog/two_stage.py): stage one stays untouched, V-TST averages the configured
number of samples, and a two-stage run trains, saves and re-evaluates end to end."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from mtl_cog.config import Config, MethodConfig, ModelConfig, TrainConfig, TwoStageConfig, load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.evaluation.inference import predict
from mtl_cog.models.network import build_network
from mtl_cog.models.two_stage import attach_second_stage_head, mean_probability_logits
from mtl_cog.objectives import build_objective
from mtl_cog.runs import rundir
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.loop import run_second_stage
from mtl_cog.training.preflight import check_registered_names

REPO = Path(__file__).resolve().parents[1]
SPEC = TaskSpec("toy", ("a", "b", "c"), (2, 2, 4), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def _split(n: int, seed: int) -> SplitData:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
    labels = torch.stack([torch.randint(0, k, (n,), generator=g) for k in SPEC.num_classes], 1)
    return SplitData(images, labels)


def _network():
    torch.manual_seed(0)
    return build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(calibrator="identity", leader=[]),
                         SPEC.layout)


def test_mean_probability_logits_average_probabilities():
    samples = torch.randn(7, 5, SPEC.layout.total) * 3
    out = mean_probability_logits(samples, SPEC.layout)
    assert torch.allclose(torch.sigmoid(out[:, :2]), torch.sigmoid(samples[:, :, :2]).mean(0), atol=1e-6)
    assert torch.allclose(torch.softmax(out[:, 2:], -1), torch.softmax(samples[:, :, 2:], -1).mean(0), atol=1e-6)


@pytest.mark.parametrize("mc_samples", [1, 4, 10])
def test_vtst_evaluation_uses_the_configured_number_of_samples(mc_samples):
    model = attach_second_stage_head(_network(), TwoStageConfig(head="variational", latent_dim=4,
                                                                mc_samples=mc_samples), SPEC.layout)
    calls = []
    model.heads.register_forward_hook(lambda *_: calls.append(1))
    images = torch.randn(6, 3, 16, 16)
    model.eval()
    with torch.no_grad():
        model(images)
    assert len(calls) == mc_samples
    calls.clear()
    model.train()
    model(images)
    assert len(calls) == 1  # training draws one sample per step
    # ... and through the evaluation path (three batches)
    calls.clear()
    accelerator = create_accelerator()
    split = _split(10, seed=1)
    logits = predict(accelerator, model, split, BatchTransform(SPEC, train=False, device=torch.device("cpu")), 4)
    assert len(calls) == 3 * mc_samples and logits.shape == (10, SPEC.layout.total)


def test_deterministic_head_is_evaluated_once():
    model = attach_second_stage_head(_network(), TwoStageConfig(head="mlp", latent_dim=4, mc_samples=10), SPEC.layout)
    calls = []
    model.heads.register_forward_hook(lambda *_: calls.append(1))
    model.eval()
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 16))
    assert len(calls) == 1


def _config(two_stage: TwoStageConfig) -> Config:
    return Config(two_stage=two_stage, train=TrainConfig(batch_size=8, eval_batch_size=16))


@pytest.mark.parametrize("head", ["mlp", "variational"])
def test_stage_one_is_not_retrained_in_stage_two(tmp_path, head):
    network = _network()
    before = {k: v.clone() for k, v in network.backbone.state_dict().items()}
    assert any("running_mean" in k for k in before)  # the backbone has BatchNorm statistics to protect
    accelerator = create_accelerator()
    cfg = TwoStageConfig(enabled=True, head=head, latent_dim=4, epochs=2, mc_samples=2)
    objective = build_objective(SPEC.layout, MethodConfig(loss="ce"))
    model = run_second_stage(accelerator, _config(cfg), network, objective, SPEC, _split(40, 2), _split(20, 3),
                             tmp_path)
    model = accelerator.unwrap_model(model)
    after = model.backbone.state_dict()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key  # parameters, running statistics, num_batches_tracked
    assert not model.backbone.training and all(not p.requires_grad for p in model.backbone.parameters())
    assert (tmp_path / rundir.STAGE_ONE_MODEL).is_file() and (tmp_path / rundir.BEST_MODEL).is_file()
    lines = (tmp_path / rundir.STAGE_TWO_METRICS).read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    counts = json.loads((tmp_path / rundir.STAGE_TWO_PARAMS).read_text())["counts"]
    assert counts["backbone"] == 0 and counts["heads"] == sum(p.numel() for p in model.heads.parameters())


def test_stage_two_stops_early_without_better_validation_nll(tmp_path):
    accelerator = create_accelerator()
    cfg = TwoStageConfig(enabled=True, head="mlp", latent_dim=4, epochs=30, patience=1, lr=1.0)  # lr 1: diverges
    objective = build_objective(SPEC.layout, MethodConfig(loss="ce"))
    run_second_stage(accelerator, _config(cfg), _network(), objective, SPEC, _split(40, 2), _split(20, 3), tmp_path)
    assert len((tmp_path / rundir.STAGE_TWO_METRICS).read_text().splitlines()) < 30


def _script(name: str):
    return importlib.import_module("mtl_cog.cli." + {"train_mtl": "train"}.get(name, name))


def test_tst_run_end_to_end_and_reevaluation(tiny_overrides, tmp_path):
    run = _script("train_mtl").main(["--config", str(REPO / "configs" / "synthetic" / "tst.yaml"), *tiny_overrides,
                                     "train.epochs=1", "two_stage.epochs=2", "two_stage.latent_dim=8", "run_name=tst"])
    params = json.loads((run / rundir.PARAMS).read_text())
    assert params["leader"] == [] and params["counts"]["calibrator"] == 0
    assert json.loads((run / rundir.STAGE_TWO_PARAMS).read_text())["counts"]["backbone"] == 0
    out = tmp_path / "eval.json"
    metrics = _script("evaluate").main(["--run", str(run), "--split", "test", "--out", str(out)])
    frame = pd.read_csv(run / rundir.TEST_METRICS).set_index("task")
    assert frame.loc["mean", "nll"] == pytest.approx(metrics["mean"]["nll"], abs=1e-5)  # the two-stage head reloads


def test_unknown_second_stage_head_is_refused_before_training():
    from mtl_cog.errors import ConfigError

    with pytest.raises(ConfigError, match="two_stage.head"):
        check_registered_names(load_config(REPO / "configs" / "digits" / "tst.yaml", ["two_stage.head=mlpp"]))
