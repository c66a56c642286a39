"""Every registered method (configs/methods/*.yaml) trains, its parameters are counted and owned
as documented, and COG-TS with a frozen leader is exactly the baseline."""

from pathlib import Path

import pytest
import torch
import yaml

from mtl_cog.config import MethodConfig, ModelConfig, OptimConfig, SyntheticConfig, load_config
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import HEADS
from mtl_cog.models.network import build_network, parameter_counts
from mtl_cog.models.two_stage import attach_second_stage_head
from mtl_cog.objectives import WithAuxiliaryLoss, build_objective
from mtl_cog.training.optim import build_optimizer, split_parameters
from mtl_cog.training.step import batch_loss

REPO = Path(__file__).resolve().parents[1]
METHOD_FILES = sorted((REPO / "configs" / "methods").glob("*.yaml"))
LAYOUT = LogitLayout((2, 2, 2, 10))  # three binary attributes and one 10-class task
TINY_OPTIONS = ["model.head_latent_dim=8", "two_stage.latent_dim=8", "two_stage.lr=1e-2", "tracking=none"]


def tiny(path: Path) -> list[str]:
    """The CPU scale's backbone for the method (configs/scales/cpu/methods/: a LiST network stays Lipschitz)."""
    scale = REPO / "configs" / "scales" / "cpu" / "methods" / f"{path.stem}.yaml"
    backbone = yaml.safe_load(scale.read_text())["model"]["backbone"] if scale.is_file() else "cog_cnn_tiny"
    return [f"model.backbone={backbone}", *TINY_OPTIONS]


def test_every_documented_method_has_a_config():
    names = {p.stem for p in METHOD_FILES}
    assert names == {"baseline", "ls", "focal", "cog_fc", "cog_ts", "cog_vs", "cog_ms", "cog_tst", "cog_ls",
                     "tst", "vtst", "mbls", "cog_mbls", "fedlas", "cog_fedlas", "fedlas_mbls", "margin", "cog_margin",
                     "list", "cog_list"}
    for dataset in ("celeba", "cifar10", "cifar100", "svhn", "digits", "synthetic", "fashion_mnist", "fashion_mosaic"):
        for name in names:
            cfg = load_config(REPO / "configs" / dataset / f"{name}.yaml")
            assert cfg.method.name == name and cfg.data.task == dataset


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(16, 3, 16, 16, generator=g)
    labels = torch.cat([torch.randint(0, 2, (16, 3), generator=g), torch.randint(0, 10, (16, 1), generator=g)], 1)
    return images, labels


def _steps(network, loss_fn, optimizer, steps: int) -> list[float]:
    images, labels = _batch()
    losses = []
    for _ in range(steps):
        loss = batch_loss(network, loss_fn, images, labels)  # with the backbone features for losses that need them
        assert torch.isfinite(loss), losses
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.stem)
def test_method_trains_without_nan_and_its_loss_falls(path):
    cfg = load_config(path, tiny(path))
    torch.manual_seed(0)
    network = build_network(cfg.model, cfg.method, LAYOUT)
    objective = build_objective(LAYOUT, cfg.method)
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim, objective)
    losses = _steps(network, objective, optimizer, 12)
    assert losses[-1] < 0.97 * losses[0], losses
    if cfg.two_stage.enabled:  # stage two: a new head on the frozen backbone, its own loss term
        second = attach_second_stage_head(network, cfg.two_stage, LAYOUT)
        second.train()
        loss_fn = WithAuxiliaryLoss(objective, second.heads, cfg.two_stage.kl_weight)
        head_optimizer = torch.optim.Adam(second.heads.parameters(), lr=cfg.two_stage.lr)
        losses = _steps(second, loss_fn, head_optimizer, 12)
        assert losses[-1] < 0.97 * losses[0], losses


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.stem)
def test_leader_group_is_exactly_the_named_modules(path):
    cfg = load_config(path, tiny(path))
    network = build_network(cfg.model, cfg.method, LAYOUT)
    groups = split_parameters(network, cfg.method.leader)
    leader_ids = {id(p) for name in cfg.method.leader for p in getattr(network, name).parameters()}
    assert {id(p) for p in groups["leader"]} == leader_ids
    assert len(groups["leader"]) + len(groups["follower"]) == len(list(network.parameters()))


def test_calibrator_parameter_counts_match_their_definitions():
    """Temperature: 1 per task; vector: scale + bias per logit; matrix: K_t^2 + K_t per task (1+1 binary);
    LiST's scale L: 1 per task, a parameter when learned by gradient (cog_list), a buffer for LiST's own update."""
    expected = {"identity": 0, "temperature": 4, "vector": 2 * 13, "matrix": 3 * 2 + 100 + 10,
                "lipschitz_scale": 4, "list": 0}
    assert set(expected) == set(CALIBRATORS.names())
    for name, count in expected.items():
        assert sum(p.numel() for p in CALIBRATORS.get(name)(LAYOUT).parameters()) == count, name


def test_matrix_calibrator_is_affine_per_binary_task_and_block_diagonal():
    cal = CALIBRATORS.get("matrix")(LAYOUT)
    with torch.no_grad():
        cal.weight.copy_(torch.randn_like(cal.weight))
        cal.bias.copy_(torch.randn_like(cal.bias))
    z = torch.randn(5, LAYOUT.total)
    out = cal(z)
    matrix = cal.matrix()
    for t in range(3):  # a binary task only sees its own logit
        assert torch.allclose(out[:, t], matrix[t, t] * z[:, t] + cal.bias[t])
    block = LAYOUT.task_slice(3)
    assert torch.allclose(out[:, block], z[:, block] @ matrix[block, block].T + cal.bias[block], atol=1e-6)
    assert matrix[:3, 3:].abs().sum() == 0 and matrix[3:, :3].abs().sum() == 0


@pytest.mark.parametrize("head", HEADS.names())
def test_heads_are_batched_per_task(head):
    """Each task's logits depend only on that task's weights: changing task 0's weights leaves the others."""
    torch.manual_seed(0)
    heads = HEADS.get(head)(6, LAYOUT, latent_dim=4)
    x = torch.randn(5, 6)
    torch.manual_seed(1)
    before = heads(x)
    with torch.no_grad():
        for p in heads.parameters():
            if p.shape[0] in (LAYOUT.num_tasks, LAYOUT.total):  # stacked per task / one row per logit column
                p[0].add_(1.0)
    torch.manual_seed(1)
    after = heads(x)
    assert not torch.allclose(before[:, 0], after[:, 0])
    assert torch.allclose(before[:, 1:], after[:, 1:])


def test_mlp_head_parameter_count_is_the_tst_stack_per_task():
    d, z = 6, 4
    heads = HEADS.get("mlp")(d, LAYOUT, latent_dim=z)
    per_task = (d * 3 * z + 3 * z) + (3 * z * z + z)
    assert sum(p.numel() for p in heads.parameters()) == 4 * per_task + LAYOUT.total * (z + 1)


def test_variational_head_parameter_count_is_two_stacks_per_task():
    """V-TST (Jordahn & Olmos): a mean stack and a log-variance stack per task, then Linear(Z, K)."""
    d, z = 6, 4
    heads = HEADS.get("variational")(d, LAYOUT, latent_dim=z)
    stack = (d * 3 * z + 3 * z) + (3 * z * z + z)
    assert sum(p.numel() for p in heads.parameters()) == 4 * 2 * stack + LAYOUT.total * (z + 1)


def test_resnet101_celeba_two_stage_head_counts():
    """The table of scripts/parameter_counts.py: TST and V-TST heads at the authors' Z = 10 on ResNet-101 (D = 2048)."""
    layout = LogitLayout((2,) * 40)
    stack = 2048 * 30 + 30 + 30 * 10 + 10  # Linear(2048, 3Z) -> ReLU -> Linear(3Z, Z), Z = 10
    output = 40 * (10 + 1)  # Linear(Z, 1) per binary attribute
    for method, expected in (("tst", 40 * stack + output), ("vtst", 40 * 2 * stack + output)):
        cfg = load_config(REPO / "configs" / "celeba" / f"{method}.yaml")
        with torch.device("meta"):  # counts need shapes only: no ResNet-101 in memory
            network = build_network(cfg.model, cfg.method, layout)
            second = parameter_counts(attach_second_stage_head(network, cfg.two_stage, layout))
        assert second["heads"] == expected and second["backbone"] == 0, method


def test_cog_ts_with_leader_lr_zero_matches_the_baseline_step_for_step():
    torch.manual_seed(3)
    baseline = build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(calibrator="identity", leader=[]),
                             LAYOUT)
    torch.manual_seed(3)
    cog_ts = build_network(ModelConfig(backbone="cog_cnn_tiny"),
                           MethodConfig(calibrator="temperature", leader=["calibrator"]), LAYOUT)
    objective = build_objective(LAYOUT, MethodConfig(loss="ce"))
    opt_base = build_optimizer(baseline, [], OptimConfig(follower_lr=1e-3))
    opt_ts = build_optimizer(cog_ts, ["calibrator"], OptimConfig(follower_lr=1e-3, leader_lr=0.0))
    for step in range(5):
        images, labels = _batch(seed=step)
        losses = []
        for net, opt in ((baseline, opt_base), (cog_ts, opt_ts)):
            loss = objective(net(images), labels).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], abs=1e-6), step
    for (name, a), b in zip(baseline.named_parameters(), [p for n, p in cog_ts.named_parameters()
                                                          if not n.startswith("calibrator")]):
        assert torch.allclose(a, b, atol=1e-6), name
    assert torch.equal(cog_ts.calibrator.temperature, torch.ones(LAYOUT.num_tasks))


def test_resnet101_celeba_parameter_counts():
    """The paper's CelebA setup: COG-FC adds 0 parameters, COG-TS 40, COG-VS/MS 80 (affine per attribute)."""
    layout = LogitLayout((2,) * 40)
    model = ModelConfig(backbone="resnet101", cifar_stem=True)
    with torch.device("meta"):  # counts need shapes only: no four ResNet-101 in memory
        counts = {name: parameter_counts(build_network(model, MethodConfig(calibrator=cal, leader=[]), layout))
                  for name, cal in (("baseline", "identity"), ("ts", "temperature"), ("vs", "vector"),
                                    ("ms", "matrix"))}
    base = counts["baseline"]["total"]
    assert counts["baseline"]["heads"] == 40 * (2048 + 1)
    assert [counts[m]["total"] - base for m in ("ts", "vs", "ms")] == [40, 80, 80]


def test_synthetic_demo_validation_is_a_fifth_of_the_training_set(tmp_path):
    """Post-hoc calibrators fit on validation while COG uses the training set: 20% of train, as CIFAR-10/SVHN."""
    default = SyntheticConfig()
    assert (default.train_size, default.val_size, default.test_size) == (1000, 200, 2000)
    cfg = load_config(REPO / "configs" / "synthetic" / "baseline.yaml",
                      [f"data.root={tmp_path}", "data.image_size=8", "data.synthetic.num_attributes=3"])
    sizes = {name: len(split) for name, split in load_task(cfg.data).splits.items()}
    assert sizes == {"train": 1000, "val": 200, "test": 2000}
