"""``mtl_cog.cog``: every trainable parameter in exactly one group, for every method and every calibrator;
any optimiser and schedule; and one clear error (exit code 2 from a command) for each bad input."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch
import yaml
from torch import nn

import mtl_cog.models.backbones  # noqa: F401  (registers cog_cnn_tiny with timm)
from mtl_cog import cog
from mtl_cog.config import MethodConfig, ModelConfig, OptimConfig, load_config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import CogError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.network import build_network
from mtl_cog.training.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]
METHOD_FILES = sorted((REPO / "configs" / "methods").glob("*.yaml"))
LAYOUT = LogitLayout((2, 2, 2, 10))  # three binary tasks and one 10-class task: 13 logits


def trainable(model: nn.Module) -> set[int]:
    return {id(p) for p in model.parameters() if p.requires_grad}


def assert_every_parameter_once(groups: list[dict], model: nn.Module, leader: list[nn.Module]) -> None:
    ids = [id(p) for group in groups for p in group["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == trainable(model)
    led = {id(p) for group in groups if group["name"] == "leader" for p in group["params"]}
    assert led == {id(p) for module in leader for p in module.parameters()}


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.stem)
def test_every_method_groups_each_parameter_once_as_fit_does(path):
    own_backbone = "backbone" in (yaml.safe_load(path.read_text()).get("model") or {})  # LiST's Lipschitz CNN
    cfg = load_config(path, ["tracking=none", "model.head_latent_dim=8", "two_stage.latent_dim=8",
                             *([] if own_backbone else ["model.backbone=cog_cnn_tiny"])])
    network = build_network(cfg.model, cfg.method, LAYOUT)
    groups = cog.parameter_groups(network, 1e-3, leader=cfg.method.leader, leader_lr=1e-4)
    assert_every_parameter_once(groups, network, [getattr(network, name) for name in cfg.method.leader])
    optimizer = build_optimizer(network, cfg.method.leader, OptimConfig(follower_lr=1e-3, leader_lr=1e-4))
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == \
        [[id(p) for p in g["params"]] for g in groups]  # fit's optimiser holds the public API's groups


def tiny_timm(num_classes: int) -> nn.Module:
    return timm.create_model("cog_cnn_tiny", num_classes=num_classes)


CALIBRATED = {  # what a user wraps: {name: (Calibrated, the modules that must lead)}
    **{name: lambda name=name: cog.Calibrated(tiny_timm(13), name, tasks=LAYOUT) for name in ("ts", "vs", "ms")},
    **{name: lambda name=name: cog.Calibrated(tiny_timm(13), name, tasks=LAYOUT, leader="fc")
       for name in CALIBRATORS.names()},
    "tst": lambda: cog.Calibrated(tiny_timm(0), "tst", tasks=LAYOUT, latent_dim=4),
    "fc": lambda: cog.Calibrated(tiny_timm(13), None, tasks=LAYOUT, leader="fc"),
}


@pytest.mark.parametrize("name", sorted(CALIBRATED))
def test_every_calibrator_groups_each_parameter_once(name):
    model = CALIBRATED[name]()
    leading = [model.get_submodule(module) for module in model.leader_modules]
    assert_every_parameter_once(cog.parameter_groups(model, 1e-3, leader_ratio=0.1), model, leading)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 13)


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_any_optimiser_and_a_schedule_over_both_groups(optimizer_class):
    torch.manual_seed(0)
    model = cog.Calibrated(tiny_timm(10), "ts", tasks=10)
    optimizer = cog.optimizer(optimizer_class, model, 1e-2, leader_ratio=0.1, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    before = model.calibrator.log_temperature.detach().clone()
    nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()
    schedule.step()
    assert not torch.equal(before, model.calibrator.log_temperature)
    assert {g["name"]: g["lr"] for g in optimizer.param_groups} == pytest.approx({"follower": 5e-3, "leader": 5e-4})


def test_groups_keep_the_users_names_under_torch_compile():
    model = cog.Calibrated(tiny_timm(10), "ts", tasks=10)
    compiled = torch.compile(model, backend="eager")
    plain, through = (cog.parameter_groups(m, 1e-3, leader_lr=1e-4) for m in (model, compiled))
    assert [[id(p) for p in g["params"]] for g in plain] == [[id(p) for p in g["params"]] for g in through]


def test_the_leader_rate_is_a_rate_or_a_share_of_the_followers():
    assert cog.leader_rate(1e-3, leader_ratio=0.1) == pytest.approx(1e-4)
    assert cog.leader_rate(1e-3, leader_lr=2e-4) == 2e-4
    for both_or_neither in ({}, {"leader_lr": 1e-4, "leader_ratio": 0.1}):
        with pytest.raises(CogError, match="leader_lr=... or as leader_ratio"):
            cog.leader_rate(1e-3, **both_or_neither)
    with pytest.raises(CogError, match="finite number >= 0"):
        cog.leader_rate(1e-3, leader_lr=-1.0)


def test_a_leader_as_fast_as_the_follower_is_warned_in_one_line():
    net = tiny_timm(5)
    with pytest.warns(UserWarning, match=r"lambda_c < lambda_f") as caught:
        cog.parameter_groups(net, 1e-3, leader="fc", leader_ratio=1.0)
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cog.parameter_groups(net, 1e-3, leader="fc", leader_lr=1e-3, allow_fast_leader=True)  # an ablation
        network = build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(name="cog_fc"), LAYOUT)
        build_optimizer(network, ["heads"], OptimConfig(follower_lr=1e-3, leader_lr=1e-3,
                                                        allow_leader_lr_geq_follower=True))  # asked for: no warning


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 4)
        self.head.weight = self.body.weight  # tied: the same tensor in a follower and a leader module


def test_bad_input_is_one_clear_error():
    net = tiny_timm(5)
    with pytest.raises(CogError, match=r"leader 'fcc': SmallCNN has no module of that name. Did you mean fc\?"):
        cog.parameter_groups(net, 1e-3, leader="fcc", leader_lr=1e-4)
    with pytest.raises(CogError, match=r"parameter head.weight is also body.weight: .* in both groups"):
        cog.parameter_groups(Tied(), 1e-3, leader="head", leader_lr=1e-4)
    net.fc.requires_grad_(False)
    with pytest.raises(CogError, match="leader 'fc' has no trainable parameter"):
        cog.parameter_groups(net, 1e-3, leader="fc", leader_lr=1e-4)
    with pytest.raises(CogError, match="names no leader: pass leader='fc'"):
        cog.parameter_groups(net, 1e-3, leader_lr=1e-4)
    with pytest.raises(CogError, match="nothing leads"):
        cog.Calibrated(net, None, tasks=5)
    with pytest.raises(CogError, match="unknown calibrator 'tz'. Did you mean ts"):
        cog.Calibrated(net, "tz", tasks=5)
    with pytest.raises(CogError, match="every task needs a whole number of classes >= 2"):
        cog.Calibrated(net, "ts", tasks=[2, 1])


def test_logits_of_the_wrong_shape_name_the_expected_one():
    wrong = cog.Calibrated(tiny_timm(10), "ts", tasks=[2] * 5)
    with pytest.raises(CogError, match=r"logits of shape \(2, 10\) do not fit .* \(batch, 5\) for 5 binary task"):
        wrong(torch.randn(2, 3, 16, 16))
    per_task = cog.Calibrated(nn.Identity(), "vs", tasks={"smiling": 2, "age": 5})
    out = per_task({"smiling": torch.randn(3), "age": torch.randn(3, 5)})
    assert out["smiling"].shape == (3,) and out["age"].shape == (3, 5)
    with pytest.raises(CogError, match=r"task 'smiling' have shape \(3, 2\).*a binary task has one logit"):
        per_task({"smiling": torch.randn(3, 2), "age": torch.randn(3, 5)})
    with pytest.raises(CogError, match=r"logits for tasks \['age'\] do not fit the calibrator's tasks"):
        per_task({"age": torch.randn(3, 5)})
    tst = cog.Calibrated(tiny_timm(7), "tst", tasks=3, in_features=16)
    with pytest.raises(CogError, match=r"the TST stack reads features \(batch, 16\); the model returned \(2, 7\)"):
        tst(torch.randn(2, 3, 16, 16))


def test_a_command_with_a_frozen_leader_exits_2_naming_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.main", "train", "--config",
                           "configs/synthetic/cog_ts.yaml", f"output_dir={tmp_path}", "tracking=none",
                           "model.backbone=cog_cnn_tiny", "method.calibrator=identity", "data.synthetic.train_size=64",
                           "data.synthetic.val_size=32", "data.synthetic.test_size=32"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: leader 'calibrator' has no trainable parameter")
