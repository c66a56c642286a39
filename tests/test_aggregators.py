"""Multi-task aggregators (mtl.aggregator): known answers and the gradient every parameter group gets."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from accelerate.utils import convert_outputs_to_fp32
from torch import nn

from mtl_cog.bundles.trajectories import task_weight_table
from mtl_cog.config import MethodConfig, counterpart_identity, method_identity
from mtl_cog.config.loader import config_from_dict
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import LinearHeads
from mtl_cog.models.network import Network
from mtl_cog.objectives import build_objective
from mtl_cog.objectives.aggregators import AGGREGATORS, build_aggregator
from mtl_cog.runs import rundir
from mtl_cog.runs.metrics_log import wandb_row
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss
from mtl_cog.training.optim import build_optimizer
from mtl_cog.training.preflight import check_registered_names
from mtl_cog.training.step import apply_update, batch_loss

NAMES = sorted(AGGREGATORS.names())


def tiny_network(layout: LogitLayout, calibrator: str = "identity", seed: int = 0) -> Network:
    torch.manual_seed(seed)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.Tanh())
    return Network(backbone, LinearHeads(6, layout), CALIBRATORS.get(calibrator)(layout))


def batch(layout: LogitLayout, n: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 2, 2, generator=g)
    labels = torch.stack([torch.randint(0, k, (n,), generator=g) for k in layout.num_classes], 1)
    return images, labels


def grads(network: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in network.named_parameters() if p.grad is not None}


def aggregated_grads(network, objective, aggregation, images, labels, on="features"):
    shared = list(network.backbone.parameters())
    network.zero_grad()
    out = aggregated_loss(create_accelerator(), network, objective, aggregation, images, labels, shared)
    out.backward.backward()
    return grads(network), out


def by_hand(network, objective, images, labels, weights):
    """The rule, computed task by task: backbone sum_t w_t grad L_t, everything else grad of the mean loss."""
    losses = objective(network(images), labels)
    backbone = list(network.backbone.parameters())
    expected = {}
    per_task = [torch.autograd.grad(losses[t], backbone, retain_graph=True) for t in range(len(losses))]
    for i, (name, _) in enumerate(network.backbone.named_parameters()):
        expected[f"backbone.{name}"] = sum(float(weights[t]) * per_task[t][i] for t in range(len(losses)))
    rest = [(n, p) for n, p in network.named_parameters() if not n.startswith("backbone.")]
    for (name, _), g in zip(rest, torch.autograd.grad(losses.mean(), [p for _, p in rest]), strict=True):
        expected[name] = g
    return expected


# ---------------------------------------------------------------------------------------------- equal


def test_equal_is_plain_training_bit_for_bit():
    """``equal`` (the default) builds no aggregator and trains exactly as a hand-written mean-loss Adam loop."""
    assert build_aggregator("equal", 3) is None
    assert config_from_dict({}).mtl.aggregator == "equal"
    layout = LogitLayout((2, 2, 3))
    cfg = config_from_dict({}).optim
    ours, plain = tiny_network(layout), tiny_network(layout)
    objective = build_objective(layout, MethodConfig(loss="ce"))
    opt_ours = build_optimizer(ours, ["heads"], cfg)
    opt_plain = torch.optim.Adam([
        {"params": list(plain.backbone.parameters()), "lr": cfg.follower_lr},
        {"params": list(plain.heads.parameters()), "lr": cfg.leader_lr},
    ], weight_decay=cfg.weight_decay)
    for step in range(5):
        images, labels = batch(layout, seed=step)
        apply_update(create_accelerator(), opt_ours, batch_loss(ours, objective, images, labels))
        opt_plain.zero_grad()
        objective(plain(images), labels).mean().backward()
        opt_plain.step()
    for a, b in zip(ours.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------------- the gradient rule


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("on", ["features", "parameters"])
def test_backbone_gets_the_weighted_gradient_and_heads_the_mean_loss(name, on):
    layout = LogitLayout((2, 2, 2, 4))
    network = tiny_network(layout, calibrator="temperature")
    objective = build_objective(layout, MethodConfig(loss="ce"))
    aggregator = build_aggregator(name, layout.num_tasks)
    if name == "uncertainty":  # not at its initial value, so the weights are not all 1
        aggregator.log_variance.data = torch.tensor([0.3, -0.2, 0.0, 0.5])
    images, labels = batch(layout)
    got, out = aggregated_grads(network, objective, Aggregation(aggregator, on), images, labels)
    expected = by_hand(network, objective, images, labels, out.weights)
    assert set(got) == set(expected)
    for key in expected:
        assert torch.allclose(got[key], expected[key], atol=1e-6), key
    assert torch.allclose(out.loss, objective(network(images), labels).mean())


@pytest.mark.parametrize("name", NAMES)
def test_one_task_every_aggregator_is_plain_training(name):
    """With one task there is nothing to aggregate: the same gradients and, over Adam steps, the same network."""
    layout = LogitLayout((2,))
    ours, plain = tiny_network(layout), tiny_network(layout)
    objective = build_objective(layout, MethodConfig(loss="ce"))
    aggregator = build_aggregator(name, 1)
    aggregation = Aggregation(aggregator, "features")
    cfg = config_from_dict({}).optim
    opt_ours, opt_plain = build_optimizer(ours, ["heads"], cfg), build_optimizer(plain, ["heads"], cfg)
    steps = 1 if name == "uncertainty" else 4  # its weight exp(-s) leaves 1 once s has learned
    for step in range(steps):
        images, labels = batch(layout, seed=step)
        shared = list(ours.backbone.parameters())
        out = aggregated_loss(create_accelerator(), ours, objective, aggregation, images, labels, shared)
        assert torch.allclose(out.weights, torch.ones(1, dtype=torch.float64))
        opt_ours.zero_grad()
        out.backward.backward()
        plain_loss = batch_loss(plain, objective, images, labels)
        opt_plain.zero_grad()
        plain_loss.backward()
        for (name_a, a), b in zip(ours.named_parameters(), plain.parameters(), strict=True):
            assert torch.allclose(a.grad, b.grad, atol=1e-7), name_a
        opt_ours.step()
        opt_plain.step()
    for a, b in zip(ours.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


# ------------------------------------------------------------------------------------- known answers


def test_orthogonal_gradients_by_hand():
    """g1 = (1, 0), g2 = (0, 2): no conflict, so UPGrad is their mean (1/2, 1/2); MGDA's min-norm point of the
    hull, min_a a^2 + 4 (1 - a)^2, is a = 4/5: weights (0.8, 0.2), the combination (0.8, 0.4)."""
    jacobian = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    gramian = jacobian @ jacobian.T
    both = torch.tensor([True, True])
    upgrad = build_aggregator("upgrad", 2).weights(gramian, torch.zeros(2), both)
    mgda = build_aggregator("mgda", 2).weights(gramian, torch.zeros(2), both)
    assert torch.allclose(upgrad, torch.tensor([0.5, 0.5], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(mgda, torch.tensor([0.8, 0.2], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(mgda.float() @ jacobian, torch.tensor([0.8, 0.4]), atol=1e-6)


def test_conflicting_gradients_upgrad_projects():
    """g1 = (1, 0), g2 = (-1, 1) conflict (g1.g2 < 0). UPGrad projects each onto the dual cone
    {x: x1 >= 0, x2 >= x1}: g1 -> (1/2, 1/2) (onto x2 = x1), g2 -> (0, 1) (onto x1 = 0), and averages them:
    (1/4, 3/4), along which neither task's loss increases to first order."""
    jacobian = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
    w = build_aggregator("upgrad", 2).weights(jacobian @ jacobian.T, torch.zeros(2), torch.tensor([True, True]))
    update = w.float() @ jacobian
    assert (jacobian @ update >= -1e-6).all()
    assert torch.allclose(update, torch.tensor([0.25, 0.75]), atol=1e-3)  # torchjd regularises G by 1e-4 I


def test_uncertainty_weighting_gradient_by_hand():
    """d/ds_t [exp(-s_t) L_t + s_t / 2] = -exp(-s_t) L_t + 1/2; the backbone's weights are exp(-s_t)."""
    aggregator = build_aggregator("uncertainty", 3)
    s = torch.tensor([0.0, 1.0, -0.5])
    aggregator.log_variance.data = s.clone()
    losses = torch.tensor([0.7, 0.2, 1.3])
    present = torch.tensor([True, True, True])
    assert torch.allclose(aggregator.weights(None, losses, present), torch.exp(-s).double())
    aggregator.penalty(losses, present).backward()
    assert torch.allclose(aggregator.log_variance.grad, -torch.exp(-s) * losses + 0.5)


# -------------------------------------------------------------------------------- missing labels


@pytest.mark.parametrize("name", NAMES)
def test_a_task_without_labels_in_the_batch_gets_weight_zero(name):
    layout = LogitLayout((2, 2, 2))
    network = tiny_network(layout)
    objective = build_objective(layout, MethodConfig(loss="ce"))
    images, labels = batch(layout)
    labels[:, 1] = MISSING_LABEL
    got, out = aggregated_grads(network, objective, Aggregation(build_aggregator(name, 3)), images, labels)
    assert out.weights[1] == 0 and (out.weights[[0, 2]] > 0).all()
    expected = by_hand(network, objective, images, labels, out.weights)
    for key in expected:
        assert torch.allclose(got[key], expected[key], atol=1e-6), key
    if name == "uncertainty":  # its s_1 is left alone: no gradient from an absent task
        network.zero_grad()
        aggregator = build_aggregator(name, 3)
        aggregator.penalty(torch.tensor([0.5, 0.0, 0.5]), torch.tensor([True, False, True])).backward()
        assert aggregator.log_variance.grad[1] == 0


def test_nonfinite_loss_gives_nan_weights_not_a_solver_error():
    w = build_aggregator("upgrad", 2).weights(torch.full((2, 2), float("nan")), torch.zeros(2),
                                              torch.tensor([True, True]))
    assert torch.isnan(w).all()


# ------------------------------------------------------------------------------------------- config


def test_unknown_aggregator_and_place_are_refused():
    with pytest.raises(ConfigError, match="mtl.aggregator"):
        check_registered_names(config_from_dict({"mtl": {"aggregator": "upgard"}}))
    with pytest.raises(ConfigError, match="mtl.aggregate_on"):
        config_from_dict({"mtl": {"aggregate_on": "heads"}})
    check_registered_names(config_from_dict({"mtl": {"aggregator": "mgda"}}))


def test_learned_log_variances_are_in_the_saved_objective_state():
    """Uncertainty weighting's s lives in the objective (attached as ``aggregator``), so the state saves it."""
    layout = LogitLayout((2, 2))
    objective = build_objective(layout, MethodConfig(loss="ce"))
    objective.add_module("aggregator", build_aggregator("uncertainty", 2))
    assert "aggregator.log_variance" in copy.deepcopy(objective).state_dict()


def _conflicting_gramian(tasks: int = 6, seed: int = 0) -> torch.Tensor:
    jacobian = torch.randn(tasks, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return jacobian @ jacobian.T


def test_pcgrad_order_is_random_seeded_by_the_run_and_leaves_the_global_generator_alone():
    """PCGrad draws a random order per task and step (Yu et al.): from its own generator, seeded by the run."""
    gramian, losses, present = _conflicting_gramian(), torch.zeros(6), torch.ones(6, dtype=torch.bool)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, other = (build_aggregator("pcgrad", 6, seed) for seed in (7, 7, 8))
    first = [a.weights(gramian, losses, present) for _ in range(20)]
    assert torch.equal(torch.get_rng_state(), before)  # the global generator did not move
    torch.manual_seed(999)  # nor does the global generator's state change PCGrad's draws
    second = [b.weights(gramian, losses, present) for _ in range(20)]
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert len({tuple(w.tolist()) for w in first}) > 1  # random: the order changes the weights
    assert any(not torch.equal(x, other.weights(gramian, losses, present)) for x in first)


def test_pcgrad_generator_travels_with_the_objective_state():
    """The generator state is a buffer of the objective (saved in the training state): loaded into a fresh
    PCGrad it continues the same sequence of orders, as a resumed run does."""
    gramian, losses, present = _conflicting_gramian(seed=1), torch.zeros(6), torch.ones(6, dtype=torch.bool)
    running = build_aggregator("pcgrad", 6, seed=3)
    for _ in range(5):
        running.weights(gramian, losses, present)
    restored = build_aggregator("pcgrad", 6, seed=0)
    restored.load_state_dict(copy.deepcopy(running.state_dict()))
    assert "rng_state" in running.state_dict()
    for _ in range(10):
        assert torch.equal(running.weights(gramian, losses, present), restored.weights(gramian, losses, present))


def test_conflict_from_the_gramian_by_hand():
    """Two opposed gradients: the mean's update raises neither loss only when it is not the zero vector."""
    from mtl_cog.training.aggregated_step import conflict_from_gramian

    jacobian = torch.tensor([[1.0, 0.0], [-0.5, 0.1]], dtype=torch.float64)
    gramian, both = jacobian @ jacobian.T, torch.tensor([True, True])
    assert bool(conflict_from_gramian(gramian, torch.tensor([0.5, 0.5]), both))  # d = (0.25, 0.05): <g_1, d> < 0
    assert not bool(conflict_from_gramian(gramian, build_aggregator("upgrad", 2).weights(gramian, torch.zeros(2),
                                                                                          both), both))
    assert not bool(conflict_from_gramian(gramian, torch.tensor([0.5, 0.5]), torch.tensor([True, False])))


@pytest.mark.parametrize("on", ["features", "parameters"])
def test_the_conflict_check_uses_the_exact_inner_products_of_the_parameter_gradients(on, monkeypatch):
    """Both places report <g_t, d> of the backbone's parameter gradients g_t and update d = sum_t w_t g_t:
    parameters from the Gramian, features by a forward-mode product (through BatchNorm, whose running
    statistics the check leaves alone)."""
    import mtl_cog.training.aggregated_step as step

    layout = LogitLayout((2, 2, 2))
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.BatchNorm1d(6), nn.Tanh())
    network = Network(backbone, LinearHeads(6, layout), CALIBRATORS.get("identity")(layout))
    objective = build_objective(layout, MethodConfig(loss="ce"))
    images, labels = batch(layout, n=32)
    labels[:, 1] = 1 - labels[:, 0]  # task 1 is task 0's opposite: a conflict to find
    shared = list(backbone.parameters())
    seen = []
    monkeypatch.setattr(step, "rises", lambda inner, sq, present: seen.append((inner, sq)) or torch.tensor(False))
    aggregation = Aggregation(build_aggregator("mgda", 3), on)
    out = aggregated_loss(create_accelerator(), network, objective, aggregation, images, labels, shared,
                          check_conflict=True)
    tracked = int(backbone[2].num_batches_tracked)
    features, logits = network(images, with_features=True)
    losses = objective(logits, labels)
    rows = torch.autograd.grad(losses, shared, grad_outputs=torch.eye(3), is_grads_batched=True)
    jacobian = torch.cat([r.reshape(3, -1) for r in rows], 1).double()
    inner, update_sq = seen[0]
    expected = jacobian @ (jacobian.T @ out.weights)
    assert torch.allclose(inner, expected, rtol=1e-5, atol=1e-9)
    assert torch.allclose(update_sq, expected @ out.weights, rtol=1e-5)
    assert tracked == 1  # only the step's own forward updated BatchNorm's running statistics
    assert out.conflict is not None


@pytest.mark.slow
def test_two_processes_give_the_one_process_gradient(launch_two_processes):
    """DDP over two halves of a batch (with missing labels): the synchronised gradients equal one process's
    aggregated step on the whole batch, for Gramians on the features and on the parameters."""
    lines = launch_two_processes("launch_aggregated_step.py")
    assert lines == sorted(f"{rank} {name} True True" for rank in (0, 1) for name in ("mgda", "upgrad", "uncertainty"))


# ---------------------------------------------------------------------------------- identity and logs


def test_the_aggregator_is_part_of_the_method_identity():
    plain = config_from_dict({"method": {"name": "cog_ts"}}).to_dict()
    upgrad = config_from_dict({"method": {"name": "cog_ts"}, "mtl": {"aggregator": "upgrad"}}).to_dict()
    on_params = config_from_dict({"method": {"name": "cog_fc"},
                                  "mtl": {"aggregator": "mgda", "aggregate_on": "parameters"}}).to_dict()
    assert method_identity(plain) == "cog_ts" and method_identity(upgrad) == "cog_ts+upgrad"
    assert method_identity(on_params) == "cog_fc+mgda_params"
    del plain["mtl"]  # a run folder written before the mtl section existed
    assert method_identity(plain) == "cog_ts"
    assert counterpart_identity("baseline+ts", upgrad) == "baseline+upgrad+ts"
    assert counterpart_identity("baseline", upgrad) == "baseline+upgrad"
    assert counterpart_identity("baseline+ts", plain) == "baseline+ts"


def test_task_weights_reach_metrics_jsonl_wandb_and_the_compare_table(tmp_path):
    lines = [{"epoch": e, "train_loss": 0.5, "lr": {"follower": 1e-3}, "val": {"nll": 0.6},
              "task_weights": {"a": 0.5 + e / 10, "b": 0.5 - e / 10}} for e in (1, 2, 3)]
    (tmp_path / rundir.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = task_weight_table([("toy", "cog_fc+upgrad", 0, tmp_path)])
    assert table.set_index("task")["first_epoch_weight"].to_dict() == pytest.approx({"a": 0.6, "b": 0.4})
    assert table.set_index("task")["last_epoch_weight"].to_dict() == pytest.approx({"a": 0.8, "b": 0.2})
    row = wandb_row(lines[-1])
    assert row["a/task_weight"] == pytest.approx(0.8) and row["b/task_weight"] == pytest.approx(0.2)
    assert task_weight_table([("toy", "cog_fc", 0, tmp_path / "none")]).empty


def test_under_bf16_the_returned_features_are_the_ones_the_heads_read():
    """Accelerate's bf16 forward hands out float32 copies of half-precision outputs; the features must still be
    the tensor the logits come from, or the aggregated gradient would never reach the backbone."""
    layout = LogitLayout((2, 2))
    network = tiny_network(layout)
    forward = convert_outputs_to_fp32(torch.autocast("cpu", dtype=torch.bfloat16)(network.forward))
    features, logits = forward(batch(layout)[0], with_features=True)
    (grad,) = torch.autograd.grad(logits.sum(), features)  # raises if nothing downstream used them
    assert grad.shape == features.shape and grad.abs().sum() > 0
