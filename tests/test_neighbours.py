"""The neighbouring losses (MbLS, FedLAS, FedLAS+, the margin-aware objective, LiST's margin CE):
known answers per term, reduction to CE / LS step for step, parameter ownership and bit-exact resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mtl_cog.cli import train
from mtl_cog.config import Config, MethodConfig, ModelConfig, OptimConfig, load_config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import CheckpointError, ConfigError
from mtl_cog.evaluation.predictions import load_predictions
from mtl_cog.models.network import build_network
from mtl_cog.objectives import build_objective
from mtl_cog.objectives.margin import MarginAwareLoss, signed_margins
from mtl_cog.objectives.mbls import binary_margin_penalty, multiclass_margin_penalty
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as resume
from mtl_cog.training import fit, resume_settings
from mtl_cog.training.loop import EpochEnd, Hooks
from mtl_cog.training.optim import OBJECTIVE_GROUP, build_optimizer, build_scheduler
from mtl_cog.training.step import batch_loss

LAYOUT = LogitLayout((2, 2, 2, 10))  # three binary attributes and one 10-class task


def _batch(seed: int = 0, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 16, 16, generator=g)
    labels = torch.cat([torch.randint(0, 2, (n, 3), generator=g), torch.randint(0, 10, (n, 1), generator=g)], 1)
    return images, labels


def _train_pair(method_a: MethodConfig, method_b: MethodConfig, steps: int = 5):
    """Train two copies of the same network (same seed) with two losses; return their loss curves and networks."""
    runs = []
    for method in (method_a, method_b):
        torch.manual_seed(7)
        network = build_network(ModelConfig(backbone="cog_cnn_tiny"), method, LAYOUT)
        objective = build_objective(LAYOUT, method)
        optimizer = build_optimizer(network, method.leader, OptimConfig(follower_lr=1e-2, leader_lr=1e-3), objective)
        losses = []
        for step in range(steps):
            images, labels = _batch(step)
            torch.manual_seed(100 + step)  # the same draws for any randomness inside the loss
            loss = batch_loss(network, objective, images, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        runs.append((losses, network, objective))
    return runs


def _assert_same_training(run_a, run_b):
    (losses_a, net_a, _), (losses_b, net_b, _) = run_a, run_b
    assert losses_a == losses_b
    for (name, a), b in zip(net_a.named_parameters(), net_b.parameters()):
        assert torch.equal(a, b), name


# ------------------------------------------------------------------------------------------ MbLS


def test_mbls_penalty_known_answers():
    # d = max - z = [0, 3, 11]; with m = 2: relu(d - 2) = [0, 1, 9], mean over the 3 classes = 10/3
    z = torch.tensor([[3.0, 0.0, -8.0]])
    assert multiclass_margin_penalty(z, 2.0).item() == pytest.approx(10 / 3)
    # binary on [0, z]: distances (|z|, 0), so relu(|z| - m) / 2
    assert binary_margin_penalty(torch.tensor([[5.0, -5.0, 1.0]]), 2.0).tolist() == [[1.5, 1.5, 0.0]]


def test_mbls_loss_is_ce_plus_lambda_times_the_penalty():
    logits, (_, labels) = torch.randn(16, LAYOUT.total) * 8, _batch()
    ce = build_objective(LAYOUT, MethodConfig(loss="ce"))(logits, labels)
    mbls = build_objective(LAYOUT, MethodConfig(loss="mbls", mbls_margin=3.0, mbls_lambda=0.5))(logits, labels)
    penalty = torch.cat([binary_margin_penalty(logits[:, :3], 3.0).mean(0),
                         multiclass_margin_penalty(logits[:, 3:], 3.0).mean().reshape(1)])
    assert torch.allclose(mbls, ce + 0.5 * penalty, atol=1e-6)


def test_mbls_with_lambda_zero_equals_ce_step_for_step():
    _assert_same_training(*_train_pair(MethodConfig(loss="ce", leader=[]),
                                       MethodConfig(loss="mbls", mbls_lambda=0.0, leader=[])))


# ---------------------------------------------------------------------------------------- FedLAS


@pytest.mark.parametrize("loss", ["fedlas", "fedlas_mbls"])
def test_fedlas_with_smoothing_zero_equals_ce_step_for_step(loss):
    run_ce, run_fedlas = _train_pair(MethodConfig(loss="ce", leader=["heads"]),
                                     MethodConfig(loss=loss, fedlas_alpha=0.0, leader=["heads"]))
    _assert_same_training(run_ce, run_fedlas)
    gate = run_fedlas[2]  # the gate trained (zero gradient) without moving
    fresh = build_objective(LAYOUT, MethodConfig(loss=loss, fedlas_alpha=0.0))
    assert {k for k, _ in gate.named_parameters()} == {k for k, _ in fresh.named_parameters()}


def _tie_gates(objective):
    """Zero the gates' last layers: p_1 = p_0, sign 0, so every sample gets r = 2 alpha sigmoid(0) = alpha."""
    with torch.no_grad():
        objective.binary_gates.w2.zero_()
        objective.binary_gates.b2.zero_()
        for gate in objective.multiclass_gates.values():
            gate[2].weight.zero_()
            gate[2].bias.zero_()


def test_fedlas_with_a_tied_gate_is_label_smoothing_alpha():
    logits, (_, labels) = torch.randn(16, LAYOUT.total) * 3, _batch()
    features = torch.rand(16, 32) * 5
    fedlas = build_objective(LAYOUT, MethodConfig(loss="fedlas", fedlas_alpha=0.2))
    _tie_gates(fedlas)
    ls = build_objective(LAYOUT, MethodConfig(loss="ls", label_smoothing=0.2))
    assert torch.allclose(fedlas(logits, labels, features=features), ls(logits, labels), atol=1e-6)


def test_fedlas_plus_with_a_tied_gate_is_ce_weighted_plus_margin_term():
    logits, (_, labels) = torch.randn(16, LAYOUT.total) * 9, _batch()
    objective = build_objective(LAYOUT, MethodConfig(loss="fedlas_mbls", fedlas_alpha=0.1, mbls_margin=6.0))
    _tie_gates(objective)
    ce = build_objective(LAYOUT, MethodConfig(loss="ce"))(logits, labels)
    penalty = torch.cat([binary_margin_penalty(logits[:, :3], 6.0).mean(0),
                         multiclass_margin_penalty(logits[:, 3:], 6.0).mean().reshape(1)])
    assert torch.allclose(objective(logits, labels, features=torch.rand(16, 8)), 0.9 * ce + 0.1 * penalty, atol=1e-6)


def test_fedlas_smoothing_follows_the_feature_norm_and_the_gate_sign():
    """r = 2 alpha sigmoid(beta gate s): a large feature norm with gate +1 smooths more than alpha, with -1 less."""
    objective = build_objective(LAYOUT, MethodConfig(loss="fedlas", fedlas_alpha=0.1, fedlas_beta=4.0))
    s = torch.tensor([2.0, 2.0, 0.0])
    r = objective.smoothing(torch.tensor([1.0, -1.0, 1.0]), s)
    expected = [0.2 / (1 + math.exp(-8.0)), 0.2 / (1 + math.exp(8.0)), 0.1]
    assert r.tolist() == pytest.approx(expected)


def test_feature_norm_indicator_running_statistics_are_the_authors():
    objective = build_objective(LAYOUT, MethodConfig(loss="fedlas", fedlas_momentum=0.95))
    features = torch.tensor([[1.0, -1.0], [3.0, 3.0]])  # L1 norms 2 and 6: mean 4, std sqrt(8)
    s = objective.indicator(features)
    mean, std = 0.95 * 4 + 0.05 * 20, 0.95 * math.sqrt(8) + 0.05 * 100
    assert objective.indicator.running_mean.item() == pytest.approx(mean)
    assert objective.indicator.running_std.item() == pytest.approx(std)
    assert s.tolist() == pytest.approx([(2 - mean) / (std + 1e-3), (6 - mean) / (std + 1e-3)])
    objective.indicator(features[:1])  # one sample has no std: the statistics stay finite and unchanged
    assert objective.indicator.running_std.item() == pytest.approx(std)


def test_fedlas_gate_gets_a_straight_through_gradient_and_its_own_group():
    torch.manual_seed(0)
    method = MethodConfig(loss="fedlas", fedlas_alpha=0.1, leader=["heads"])
    network = build_network(ModelConfig(backbone="cog_cnn_tiny"), method, LAYOUT)
    objective = build_objective(LAYOUT, method)
    optimizer = build_optimizer(network, method.leader, OptimConfig(follower_lr=1e-3, leader_lr=1e-4), objective)
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"follower", "leader", OBJECTIVE_GROUP}
    assert groups[OBJECTIVE_GROUP]["lr"] == 1e-3  # the follower's rate (training/optim.py says why)
    assert {id(p) for p in groups[OBJECTIVE_GROUP]["params"]} == {id(p) for p in objective.parameters()}
    batch_loss(network, objective, *_batch()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in objective.parameters())


def test_a_follower_rate_changed_on_resume_reaches_the_gate():
    method = MethodConfig(loss="fedlas", leader=["heads"])
    network = build_network(ModelConfig(backbone="cog_cnn_tiny"), method, LAYOUT)
    optimizer = build_optimizer(network, method.leader, OptimConfig(follower_lr=1e-3, leader_lr=1e-4),
                                build_objective(LAYOUT, method))
    scheduler = build_scheduler(optimizer, OptimConfig())
    old, new = Config(method=method), Config(method=method, optim=OptimConfig(follower_lr=5e-4, leader_lr=1e-4))
    resume_settings.apply_to_optimizer(new, resume_settings.changed_settings(old, new), optimizer, scheduler)
    assert {g["name"]: g["lr"] for g in optimizer.param_groups} == {"follower": 5e-4, "leader": 1e-4,
                                                                    OBJECTIVE_GROUP: 5e-4}


# --------------------------------------------------------------------------- margin-aware objective


def test_signed_margins_known_answers():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0] + [0.0] * 8])  # binary 2, -1, 0.5; class scores 3, 1, 0...
    labels = torch.tensor([[1, 1, 0, 1]])
    assert signed_margins(logits, labels, LAYOUT).tolist() == [[2.0, -1.0, -0.5, 1.0 - 3.0]]


def test_margin_objective_without_its_terms_equals_ce_step_for_step():
    _assert_same_training(*_train_pair(MethodConfig(loss="ce", leader=[]),
                                       MethodConfig(loss="margin", margin_lambda=0.0, margin_mu=0.0, leader=[])))


class _LinearOnFeatures(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, features):
        return features @ self.weight.T


def test_margin_objective_terms_known_answers():
    """Linear heads z = W phi: the slope of a binary margin along v is (2y-1) w_t . v, scaled by |phi|/sqrt(D)."""
    layout = LogitLayout((2, 2))
    torch.manual_seed(0)
    heads = _LinearOnFeatures(torch.randn(2, 6))
    features = torch.randn(5, 6, requires_grad=True)
    labels = torch.randint(0, 2, (5, 2))
    logits = heads(features)
    objective = MarginAwareLoss(layout, MethodConfig(margin_lambda=0.3, margin_gamma=2.0, margin_rho=0.5,
                                                     margin_mu=0.7))
    torch.manual_seed(1)
    loss = objective(logits, labels, features=features)
    torch.manual_seed(1)
    v = torch.randn(5, 6)
    sign = 2 * labels.double() - 1
    margins = sign * logits.detach().double()
    slopes = sign * (v.double() @ heads.weight.detach().double().T) * (
        features.detach().double().norm(dim=1, keepdim=True) / math.sqrt(6))
    ce = F.binary_cross_entropy_with_logits(logits.detach().double(), labels.double(), reduction="none").mean(0)
    tail = torch.exp(-2.0 * torch.relu(margins + 0.5 * slopes)).mean(0)
    expected = ce + 0.3 * tail + 0.7 * slopes.pow(2).mean(0)
    assert torch.allclose(loss.double(), expected, atol=1e-5)
    loss.sum().backward()  # every term reaches the heads and the features
    assert heads.weight.grad.abs().sum() > 0 and features.grad.abs().sum() > 0


def test_margin_smoothness_term_estimates_the_squared_slope():
    """E_v[s^2] = |phi|^2 / D * |d m / d phi|^2: over many draws the mean matches the exact slope."""
    layout = LogitLayout((10,))
    torch.manual_seed(0)
    heads = _LinearOnFeatures(torch.randn(10, 4))
    features = torch.randn(2000, 4).requires_grad_()
    labels = torch.randint(0, 10, (2000, 1))
    logits = heads(features)
    objective = MarginAwareLoss(layout, MethodConfig())
    squares = torch.stack([objective.margins_and_slopes(logits, labels, features)[1].pow(2).mean()
                           for _ in range(30)])  # 60,000 draws of v
    runner_up = logits.detach().masked_fill(F.one_hot(labels[:, 0], 10).bool(), -math.inf).argmax(1)
    gradient = heads.weight.detach()[labels[:, 0]] - heads.weight.detach()[runner_up]
    exact = (features.detach().norm(dim=1) ** 2 / 4 * gradient.norm(dim=1) ** 2).mean()
    assert squares.mean().item() == pytest.approx(exact.item(), rel=0.05)


# --------------------------------------------------------------------------------- LiST's margin CE


def test_margin_ce_shifts_the_true_logit():
    logits, (_, labels) = torch.randn(16, LAYOUT.total), _batch()
    loss = build_objective(LAYOUT, MethodConfig(loss="margin_ce", list_margin=2.0))(logits, labels)
    shifted = logits.clone()
    shifted[:, :3] -= 2.0 * (2 * labels[:, :3] - 1)
    shifted[:, 3:] -= 2.0 * F.one_hot(labels[:, 3], 10)
    assert torch.allclose(loss, build_objective(LAYOUT, MethodConfig(loss="ce"))(shifted, labels), atol=1e-6)
    no_margin = build_objective(LAYOUT, MethodConfig(loss="margin_ce", list_margin=0.0))(logits, labels)
    assert torch.equal(no_margin, build_objective(LAYOUT, MethodConfig(loss="ce"))(logits, labels))


# ------------------------------------------------------------------------ binary tasks on [0, z]


@pytest.mark.parametrize("loss", ["mbls", "margin_ce"])
def test_binary_loss_is_the_two_class_loss_on_zero_and_z(loss):
    objective = build_objective(LAYOUT, MethodConfig(loss=loss, mbls_margin=1.5, list_margin=0.7))
    z, y = torch.randn(32, 3) * 4, torch.randint(0, 2, (32, 3))
    binary = objective.binary_loss(z, y.float()).mean(0)  # per-sample losses (B, Tb), reduced like the base does
    two_class = torch.stack([objective.multiclass_loss(torch.stack([torch.zeros(32), z[:, t]], 1), y[:, t])
                             for t in range(3)])
    assert torch.allclose(binary, two_class, atol=1e-6)


@pytest.mark.parametrize("loss", ["fedlas", "fedlas_mbls"])
def test_fedlas_binary_regulariser_is_the_two_class_one(loss):
    objective = build_objective(LAYOUT, MethodConfig(loss=loss, mbls_margin=1.5))
    z = torch.randn(32, 3) * 4
    two_class = torch.stack([objective.multiclass_regulariser(torch.stack([torch.zeros(32), z[:, t]], 1))
                             for t in range(3)], 1)
    assert torch.allclose(objective.binary_regulariser(z), two_class, atol=1e-6)


def test_binary_signed_margin_is_the_two_class_margin():
    z, y = torch.randn(32, 1) * 4, torch.randint(0, 2, (32, 1))
    two_class = torch.stack([torch.zeros(32), z[:, 0]], 1)
    expected = two_class.gather(1, y) - two_class.gather(1, 1 - y)
    assert torch.allclose(signed_margins(z, y, LogitLayout((2,))), expected)


# ------------------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize("key,value", [("mbls_margin", -1.0), ("mbls_lambda", float("nan")), ("fedlas_alpha", 0.6),
                                       ("fedlas_momentum", 0.0), ("margin_gamma", float("inf")), ("list_init", 0.0),
                                       ("list_rate", 1.5), ("certify_eps", [0.1, -0.2])])
def test_bad_method_settings_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"method.{key}"):
        MethodConfig(**{key: value}).validate()


@pytest.mark.parametrize("loss", ["mbls", "fedlas", "fedlas_mbls", "margin", "margin_ce"])
def test_losses_stay_finite_on_huge_logits_and_a_single_sample(loss):
    objective = build_objective(LAYOUT, MethodConfig(loss=loss))
    logits = (torch.randn(1, LAYOUT.total) * 1e4).requires_grad_()
    features = torch.randn(1, 8, requires_grad=True)
    heads = _LinearOnFeatures(torch.randn(LAYOUT.total, 8))
    logits = heads(features) * 1e4  # the margin loss needs logits that depend on the features
    labels = torch.tensor([[0, 1, 1, 3]])
    out = objective(logits, labels, features=features) if objective.needs_features else objective(logits, labels)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(features.grad).all()


# ------------------------------------------------------------------------------ run folder, resume


class _Killed(Exception):
    pass


def _kill_at_epoch(epoch: int):
    def hook(end: EpochEnd) -> None:
        if end.epoch == epoch:  # after the epoch's metrics line, before its state: a kill at the worst moment
            raise _Killed

    return Hooks(on_epoch_end=hook)


def test_training_state_saves_and_restores_the_losss_own_state(tmp_path):
    method = MethodConfig(loss="fedlas", fedlas_alpha=0.1)
    torch.manual_seed(0)
    network = build_network(ModelConfig(backbone="cog_cnn_tiny"), method, LAYOUT)
    objective = build_objective(LAYOUT, method)
    optimizer = build_optimizer(network, [], OptimConfig(), objective)
    scheduler = build_scheduler(optimizer, OptimConfig())
    for step in range(3):
        loss = batch_loss(network, objective, *_batch(step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path / "state.safetensors"
    resume.save_training_state(path, network, optimizer, scheduler, resume.Progress(), objective)
    torch.manual_seed(1)
    fresh_net = build_network(ModelConfig(backbone="cog_cnn_tiny"), method, LAYOUT)
    fresh = build_objective(LAYOUT, method)
    fresh_opt = build_optimizer(fresh_net, [], OptimConfig(), fresh)
    resume.load_training_state(path, fresh_net, fresh_opt, build_scheduler(fresh_opt, OptimConfig()), fresh)
    for key, value in objective.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key]), key
    assert fresh.indicator.running_mean.item() != 20.0  # the running statistics came back, not the initial ones
    group = {g["name"]: g for g in fresh_opt.param_groups}[OBJECTIVE_GROUP]
    assert all(fresh_opt.state[p] for p in group["params"])  # and the gate's Adam moments
    ce_net = build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(), LAYOUT)
    ce_opt = build_optimizer(ce_net, [], OptimConfig())
    with pytest.raises(CheckpointError):  # a FedLAS state does not fit a plain cross-entropy run
        resume.load_training_state(path, ce_net, ce_opt, build_scheduler(ce_opt, OptimConfig()),
                                   build_objective(LAYOUT, MethodConfig()))


@pytest.mark.slow  # three short training runs: ~15 s alone, more on a shared machine
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_fedlas_run_resumes_bit_exactly_with_its_gate_and_statistics(tmp_path, tiny_overrides):
    overrides = [*tiny_overrides, "train.epochs=2", "optim.lr_step_epochs=1", "optim.lr_gamma=0.5"]
    config = "configs/synthetic/cog_fedlas.yaml"
    with pytest.raises(_Killed):
        fit(load_config(config, [*overrides, "run_name=cut"]), hooks=_kill_at_epoch(2))
    interrupted = tmp_path / "runs" / "cut"
    train.main(["--resume", str(interrupted)])
    straight = train.main(["--config", config, *overrides, "run_name=straight"])
    a, b = load_file(str(interrupted / rundir.STATE)), load_file(str(straight / rundir.STATE))
    assert any(k.startswith("objective/indicator.running_mean") for k in a)
    assert any(k.startswith("objective/binary_gates.") for k in a)
    assert set(a) == set(b)
    for key in a:
        if not key.startswith("rng/"):
            assert torch.equal(a[key], b[key]), key
    for split in ("val", "test"):
        za = load_predictions(interrupted / rundir.predictions_file(split)).logits
        zb = load_predictions(straight / rundir.predictions_file(split)).logits
        assert all(np.array_equal(x, y) for x, y in zip(za, zb))
