import torch
import torch.nn.functional as F

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.objectives import OBJECTIVES, build_objective

LAYOUT = LogitLayout((2, 3, 2))  # binary, 3-class, binary -> columns [0], [1,2,3], [4]


def _batch():
    torch.manual_seed(0)
    logits = torch.randn(8, LAYOUT.total)
    labels = torch.stack([torch.randint(0, 2, (8,)), torch.randint(0, 3, (8,)), torch.randint(0, 2, (8,))], 1)
    return logits, labels


def test_ce_per_task_matches_torch():
    logits, labels = _batch()
    losses = build_objective(LAYOUT, MethodConfig(loss="ce"))(logits, labels)
    assert losses.shape == (3,)
    assert torch.allclose(losses[0], F.binary_cross_entropy_with_logits(logits[:, 0], labels[:, 0].float()))
    assert torch.allclose(losses[1], F.cross_entropy(logits[:, 1:4], labels[:, 1]))
    assert torch.allclose(losses[2], F.binary_cross_entropy_with_logits(logits[:, 4], labels[:, 2].float()))


def test_binary_label_smoothing_equals_two_class_smoothing():
    logits, labels = _batch()
    eps = 0.1
    ls = build_objective(LAYOUT, MethodConfig(loss="ls", label_smoothing=eps))(logits, labels)
    two_class = torch.stack([torch.zeros(8), logits[:, 0]], 1)
    assert torch.allclose(ls[0], F.cross_entropy(two_class, labels[:, 0], label_smoothing=eps), atol=1e-6)


def test_focal_with_gamma_zero_is_ce():
    logits, labels = _batch()
    focal = build_objective(LAYOUT, MethodConfig(loss="focal", focal_gamma=0.0))(logits, labels)
    ce = build_objective(LAYOUT, MethodConfig(loss="ce"))(logits, labels)
    assert torch.allclose(focal, ce, atol=1e-6)


def test_every_loss_is_differentiable():
    logits, labels = _batch()
    heads = torch.nn.Linear(6, LAYOUT.total)
    for name in OBJECTIVES.names():
        objective = build_objective(LAYOUT, MethodConfig(loss=name))
        if objective.needs_features:  # logits computed from the features, as in the network
            features = torch.randn(8, 6, requires_grad=True)
            z = heads(features)
            z.retain_grad()
            objective(z, labels, features=features).mean().backward()
        else:
            z = logits.clone().requires_grad_()
            objective(z, labels).mean().backward()
        assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0, name
