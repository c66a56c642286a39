"""Curvature (GGN top eigenvalue, Hutchinson trace) against models whose Hessian is known; margins by hand."""

import numpy as np
import pytest
import torch
from torch import nn

from mtl_cog.cli.calibration_drift import ece_curvature_correlation
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.evaluation.sharpness import hutchinson_trace, margin_quantiles, signed_margins, top_eigenvalue


def _linear_model(inputs: int, outputs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, outputs)).double()
    with torch.no_grad():
        model[1].weight.mul_(3)  # confident predictions: a Hessian far from a multiple of the identity
    return model


def _exact_hessian(model: nn.Module, images: torch.Tensor, layout: LogitLayout) -> np.ndarray:
    """The Hessian of the summed batch-mean NLL in (weight, bias), by hand: a linear model's GGN is its Hessian.

    Per sample, with x̃ = [x, 1] and H_z the Hessian in the logits (σ(1−σ) per binary logit,
    diag(p) − ppᵀ per K-class block): H = (1/B) Σ_i H_z,i ⊗ x̃_i x̃_iᵀ in (output, input) order;
    the parameters are ordered (all weights row by row, then all biases), as model.parameters().
    """
    x = images.reshape(len(images), -1).numpy()
    z = model(images).detach().numpy()
    n, d = x.shape
    outputs = z.shape[1]
    hz = np.zeros((n, outputs, outputs))
    for task in range(layout.num_tasks):
        block = layout.task_slice(task)
        if layout.widths[task] == 1:
            p = 1 / (1 + np.exp(-z[:, block.start]))
            hz[:, block.start, block.start] = p * (1 - p)
        else:
            e = np.exp(z[:, block] - z[:, block].max(1, keepdims=True))
            p = e / e.sum(1, keepdims=True)
            hz[:, block, block] = np.einsum("ij,jk->ijk", p, np.eye(p.shape[1])) - np.einsum("ij,ik->ijk", p, p)
    xt = np.concatenate([x, np.ones((n, 1))], axis=1)
    full = np.einsum("iab,ic,id->acbd", hz, xt, xt).reshape(outputs * (d + 1), outputs * (d + 1)) / n
    # reorder (output, [inputs..., bias]) -> weights (output-major) then biases
    index = np.arange(outputs * (d + 1)).reshape(outputs, d + 1)
    order = np.concatenate([index[:, :d].reshape(-1), index[:, d]])
    return full[np.ix_(order, order)]


@pytest.mark.parametrize("classes", [(2, 2, 2), (2, 4, 3)])
def test_curvature_of_a_model_with_a_known_hessian(classes):
    layout = LogitLayout(classes)
    images = torch.randn(64, 1, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = _linear_model(6, layout.total, seed=1)
    hessian = _exact_hessian(model, images, layout)
    eigenvalues = np.linalg.eigvalsh(hessian)
    value, used = top_eigenvalue(model, images, layout, iterations=500, tol=1e-10)
    assert value == pytest.approx(eigenvalues[-1], rel=1e-6) and used < 500
    trace, stderr = hutchinson_trace(model, images, layout, samples=400)
    assert abs(trace - np.trace(hessian)) < 4 * stderr and stderr < 0.1 * np.trace(hessian)
    assert model.training  # the measurement restores the mode it found


def test_curvature_leaves_out_parameters_the_logits_do_not_use():
    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _linear_model(4, 2, seed=2)
            self.unused = nn.Linear(3, 3).double()  # e.g. a head that is not part of the forward pass

        def forward(self, x):
            return self.net(x)

    layout = LogitLayout((2, 2))
    model = WithUnused()
    images = torch.randn(16, 4, dtype=torch.float64)
    value, _ = top_eigenvalue(model, images, layout, iterations=200, tol=1e-10)
    assert value == pytest.approx(np.linalg.eigvalsh(_exact_hessian(model.net, images, layout))[-1], rel=1e-6)
    with pytest.raises(ValueError, match="layout"):
        top_eigenvalue(model, images, LogitLayout((2, 2, 2)))


def test_signed_margins_and_their_quantiles_by_hand():
    binary = np.array([2.0, -1.0, 0.5, -3.0])
    multi = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.5]])
    margins = signed_margins([binary, multi], [np.array([1, 1, 0, 0]), np.array([0, 0])])
    # binary: (2y − 1) z; multi-class: z_y − max of the others (3 − 1, 0 − 2)
    assert margins.tolist() == [2.0, -1.0, -0.5, 3.0, 2.0, -2.0]
    q = margin_quantiles([binary], [np.array([1, 1, 0, 0])], quantiles=(0.0, 0.5, 1.0))
    assert q == {"margin_q00": -1.0, "margin_q50": pytest.approx(0.75), "margin_q100": 3.0}


def test_ece_curvature_correlation_needs_three_epochs():
    lines = [{"epoch": e, "val_ece@15": ece, "ggn_top_eigenvalue": lam}
             for e, ece, lam in ((1, 0.05, 1.0), (2, 0.07, 3.0), (3, 0.06, 2.0), (4, 0.09, 5.0))]
    assert ece_curvature_correlation(lines, "val_ece@15") == {"spearman_val_ece@15_vs_ggn_top_eigenvalue": 1.0}
    assert ece_curvature_correlation(lines[:2], "val_ece@15") == {}
    lines[1]["val_ece@15"] = 0.1  # ranks 1, 4, 2, 3 against 1, 3, 2, 4: rho = 1 − 6·2 / (4·15) = 0.8
    assert ece_curvature_correlation(lines, "val_ece@15")["spearman_val_ece@15_vs_ggn_top_eigenvalue"] == 0.8
