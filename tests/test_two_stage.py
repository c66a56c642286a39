"""TST / V-TST (mtl_cog/models/two_stage.py): the authors' head structure, variance bound, KL
scaling and stage-two settings; stage one stays untouched, V-TST averages the configured number
of samples, one-stage runs refuse the variational head, and a two-stage run trains, saves and
re-evaluates end to end."""

import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from mtl_cog.config import Config, MethodConfig, ModelConfig, TrainConfig, TwoStageConfig, load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.task_api import LogitLayout, SplitData, TaskSpec
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.inference import predict, predict_split
from mtl_cog.evaluation.scoring import score
from mtl_cog.models.heads import VariationalHeads, gaussian_kl
from mtl_cog.models.network import build_network
from mtl_cog.models.two_stage import attach_second_stage_head, mean_probability_logits
from mtl_cog.objectives import WithAuxiliaryLoss, build_objective
from mtl_cog.runs import rundir
from mtl_cog.runs.checkpoint import read_metadata
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
    with pytest.raises(ConfigError, match="two_stage.head"):
        check_registered_names(load_config(REPO / "configs" / "digits" / "tst.yaml", ["two_stage.head=mlpp"]))


# --- the authors' V-TST head: two stacks, bounded variance, KL / Z per task ---------------------------------

LAYOUT = LogitLayout((2, 2, 4))


def _set_moments(heads: VariationalHeads, means: list[float], raw_log_var: float) -> None:
    """Make every sample's latent mean of task t equal means[t] and the log-variance stack output raw_log_var."""
    with torch.no_grad():
        heads.w2.zero_()
        heads.b2.copy_(torch.tensor(means)[:, None].expand_as(heads.b2))
        heads.log_var_w2.zero_()
        heads.log_var_b2.fill_(raw_log_var)


def test_variational_head_has_separate_mean_and_log_variance_stacks():
    d, z = 6, 5
    heads = VariationalHeads(d, LAYOUT, latent_dim=z)
    stack = d * 3 * z + 3 * z + 3 * z * z + z  # Linear(D,3Z) -> ReLU -> Linear(3Z,Z)
    assert sum(p.numel() for p in heads.parameters()) == LAYOUT.num_tasks * 2 * stack + LAYOUT.total * (z + 1)
    features = torch.randn(4, d)
    mean, log_var = heads.moments(features)
    with torch.no_grad():  # the log-variance stack alone moves the log-variance, not the mean
        heads.log_var_b1.add_(1.0)
    mean2, log_var2 = heads.moments(features)
    assert torch.equal(mean, mean2) and not torch.allclose(log_var, log_var2)


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e6])
def test_variational_variance_is_at_most_one_and_finite(scale):
    torch.manual_seed(0)
    heads = VariationalHeads(6, LAYOUT, latent_dim=4)
    with torch.no_grad():
        for p in heads.parameters():
            p.mul_(scale)
    _, log_var = heads.moments(torch.randn(64, 6) * scale)
    assert torch.isfinite(log_var).all() and (log_var <= 0).all() and (log_var.exp() <= 1).all()
    heads.train()
    assert torch.isfinite(heads(torch.randn(8, 6) * scale)).all() and torch.isfinite(heads.auxiliary_loss()).all()


def test_gaussian_kl_known_values():
    assert gaussian_kl(torch.zeros(3, 7), torch.zeros(3, 7)).abs().max() == 0  # q = N(0, I): no divergence
    # KL(N(1, 1) || N(0, 1)) = 1/2 per dimension; KL(N(0, e^-2) || N(0, 1)) = (e^-2 - 1 + 2) / 2
    assert gaussian_kl(torch.ones(1, 4), torch.zeros(1, 4)).item() == pytest.approx(2.0)
    assert gaussian_kl(torch.zeros(1, 1), torch.full((1, 1), -2.0)).item() == pytest.approx(0.5 * (math.exp(-2) + 1))


@pytest.mark.parametrize("z", [1, 3, 17])
def test_kl_term_is_per_task_batch_mean_of_summed_kl_over_z(z):
    """Means (0, 1, 2) per task, variance 1: sum_d KL_d = Z * m^2 / 2, so KL / Z = m^2 / 2 whatever Z."""
    heads = VariationalHeads(6, LAYOUT, latent_dim=z)
    _set_moments(heads, [0.0, 1.0, 2.0], raw_log_var=40.0)  # logsigmoid(40) = -4e-18: variance 1
    heads.train()
    heads(torch.randn(9, 6))
    assert heads.auxiliary_loss().tolist() == pytest.approx([0.0, 0.5, 2.0], abs=1e-6)


def test_auxiliary_loss_is_added_task_by_task_with_weight():
    heads = VariationalHeads(6, LAYOUT, latent_dim=3)
    _set_moments(heads, [0.0, 1.0, 2.0], raw_log_var=40.0)
    heads.train()
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    features, labels = torch.randn(9, 6), torch.stack([torch.randint(0, k, (9,)) for k in (2, 2, 4)], 1)
    torch.manual_seed(5)
    logits = heads(features)
    torch.manual_seed(5)
    total = WithAuxiliaryLoss(objective, heads, weight=1.0)(heads(features), labels)
    expected = objective(logits, labels) + torch.tensor([0.0, 0.5, 2.0])
    assert total.shape == (3,) and torch.allclose(total, expected, atol=1e-5)


def test_stage_two_defaults_are_the_authors():
    """Adam 1e-4, 40 epochs, best validation checkpoint without early stopping, Z = 10, KL weight 1."""
    default = TwoStageConfig()
    for path in ("tst.yaml", "vtst.yaml"):
        shipped = load_config(REPO / "configs" / "cifar10" / path).two_stage
        for cfg in (default, shipped):
            assert (cfg.epochs, cfg.lr, cfg.patience, cfg.latent_dim, cfg.weight_decay) == (40, 1e-4, None, 10, 0.0)
    vtst = load_config(REPO / "configs" / "cifar10" / "vtst.yaml").two_stage
    assert (vtst.head, vtst.kl_weight, vtst.mc_samples) == ("variational", 1.0, 10)
    assert default.kl_weight == 1.0
    assert load_config(REPO / "configs" / "cifar10" / "cog_tst.yaml").model.head_latent_dim == 10


def test_stage_two_patience_must_be_positive_or_null():
    with pytest.raises(ConfigError, match="two_stage.patience"):
        load_config(REPO / "configs" / "digits" / "tst.yaml", ["two_stage.patience=0"])
    assert load_config(REPO / "configs" / "digits" / "tst.yaml", ["two_stage.patience=null"]).two_stage.patience is None


def test_stage_two_runs_every_epoch_and_keeps_the_best_validation_nll(tmp_path):
    """No early stopping by default: a diverging head (lr 1) still runs all epochs, and the kept
    checkpoint is the epoch with the lowest validation NLL, with the configured learning rate."""
    accelerator = create_accelerator()
    cfg = TwoStageConfig(enabled=True, head="mlp", latent_dim=4, epochs=6, lr=1.0)
    objective = build_objective(SPEC.layout, MethodConfig(loss="ce"))
    model = run_second_stage(accelerator, _config(cfg), _network(), objective, SPEC, _split(40, 2), _split(20, 3),
                             tmp_path)
    lines = [json.loads(line) for line in (tmp_path / rundir.STAGE_TWO_METRICS).read_text().splitlines()]
    assert [line["epoch"] for line in lines] == list(range(1, 7))
    assert all(line["lr"] == {"heads": 1.0} for line in lines)
    nll = [line["val_nll"] for line in lines]
    best = 1 + min(range(6), key=nll.__getitem__)
    assert int(read_metadata(tmp_path / rundir.BEST_MODEL)["epoch"]) == best
    # the returned network is that checkpoint: it reproduces the best validation NLL
    again = score(predict_split(accelerator, model, SPEC, _split(20, 3), 8), [15])["mean"]["nll"]
    assert again == pytest.approx(min(nll), rel=1e-5)


@pytest.mark.parametrize("config", ["baseline.yaml", "cog_fc.yaml", "tst.yaml"])
def test_one_stage_variational_head_is_refused(config, tiny_overrides):
    cfg = load_config(REPO / "configs" / "synthetic" / config, ["model.head=variational"])
    with pytest.raises(ConfigError, match="model.head='variational'.*two_stage.head=variational"):
        check_registered_names(cfg)
    out = Path([o for o in tiny_overrides if o.startswith("output_dir=")][0].split("=", 1)[1])
    with pytest.raises(ConfigError, match="model.head"):
        _script("train_mtl").main(["--config", str(REPO / "configs" / "synthetic" / config), *tiny_overrides,
                                   "model.head=variational", "run_name=refused"])
    assert not (out / "refused").exists()  # refused before any run folder is made
