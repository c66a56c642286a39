"""Parameter ownership: every trainable parameter in exactly one group; the leader gets leader_lr."""

import pytest
import torch

from mtl_cog.config import MethodConfig, ModelConfig, OptimConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.network import build_network, parameter_counts
from mtl_cog.training.optim import build_optimizer, split_parameters

LAYOUT = LogitLayout((2,) * 40)
METHODS = {
    "baseline": MethodConfig(name="baseline", calibrator="identity", leader=[]),
    "cog_fc": MethodConfig(name="cog_fc", calibrator="identity", leader=["heads"]),
    "cog_ts": MethodConfig(name="cog_ts", calibrator="temperature", leader=["calibrator"]),
}


def _net(method):
    return build_network(ModelConfig(backbone="cog_cnn_tiny"), METHODS[method], LAYOUT)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_groups_cover_every_parameter_once(method):
    net = _net(method)
    groups = split_parameters(net, METHODS[method].leader)
    ids = [id(p) for g in groups.values() for p in g]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in net.parameters() if p.requires_grad}


def test_cog_fc_adds_no_parameter_and_cog_ts_one_per_task():
    base = parameter_counts(_net("baseline"))
    assert parameter_counts(_net("cog_fc")) == base
    ts = parameter_counts(_net("cog_ts"))
    assert ts["total"] - base["total"] == 40 and ts["calibrator"] == 40


def test_cog_fc_heads_are_leader_only():
    net = _net("cog_fc")
    groups = split_parameters(net, ["heads"])
    assert {id(p) for p in groups["leader"]} == {id(p) for p in net.heads.parameters()}
    assert not {id(p) for p in groups["follower"]} & {id(p) for p in net.heads.parameters()}


@pytest.mark.parametrize("method", ["cog_fc", "cog_ts"])
def test_leader_really_gets_leader_lr(method):
    """One SGD-free check: with Adam's first step, each parameter moves by ~lr (sign of grad)."""
    torch.manual_seed(0)
    net = _net(method)
    cfg = OptimConfig(follower_lr=1e-2, leader_lr=1e-4)
    opt = build_optimizer(net, METHODS[method].leader, cfg)
    assert {g["name"]: g["lr"] for g in opt.param_groups} == {"follower": 1e-2, "leader": 1e-4}
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    net(torch.randn(4, 3, 16, 16)).pow(2).mean().backward()
    opt.step()
    leader_prefix = METHODS[method].leader[0]
    for name, param in net.named_parameters():
        step = (param.detach() - before[name]).abs()
        moved = step[step > 0]
        if moved.numel() == 0:
            continue
        expected = 1e-4 if name.startswith(leader_prefix) else 1e-2
        assert moved.max().item() == pytest.approx(expected, rel=1e-2), name


def test_baseline_has_only_follower_group():
    opt = build_optimizer(_net("baseline"), [], OptimConfig())
    assert [g["name"] for g in opt.param_groups] == ["follower"]
