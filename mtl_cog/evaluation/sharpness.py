"""Sharpness of the loss surface and the tail of the margin distribution, to set beside calibration.

Curvature is measured with the **generalised Gauss–Newton** (GGN) matrix G = Jᵀ H J of the
multi-task NLL on a fixed batch of inputs: J is the Jacobian of the network's flat logits with
respect to its trainable parameters and H the Hessian of the loss with respect to the logits,
block-diagonal per sample and task, divided by the batch size B (the loss is the sum over tasks of
the batch-mean NLL, the quantity ``nll`` averages per task):

- binary task, one logit z: H = σ(z)(1 − σ(z));
- K-class task: H = diag(p) − p pᵀ with p = softmax(z).

G is positive semi-definite, equals the Hessian of the loss for a model linear in its
parameters, and drops only the terms with second derivatives of the network (Schraudolph, 2002;
Martens, 2020). It does not depend on the labels. Two summaries:

- ``top_eigenvalue``: λ_max(G) by power iteration on G-vector products (G is PSD, so the
  dominant eigenvalue is the largest), from a seeded random start, stopped when λ changes by
  less than ``tol`` relative or after ``iterations`` products;
- ``trace``: Hutchinson's estimator tr(G) = E[vᵀ G v] over Rademacher vectors v, with its
  standard error.

A G-vector product is Jᵀ(H(Jv)): Jv by the double-backward trick (the gradient of the linear map
u ↦ Jᵀu with respect to u), then one backward pass; this needs only first-order autograd support
from every layer, which forward-mode AD (``torch.func.jvp``) does not have everywhere. The
network is put in eval mode for the measurement (no dropout, no batch-norm statistics updates)
and restored afterwards.

Margins (``margin_quantiles``) are the signed margins of the labels: (2y − 1) z for a binary task
(positive when the prediction is right), z_y − max_{k≠y} z_k for a K-class task, pooled over tasks.
The upper tail grows as a network becomes confident on examples it gets right, the lower tail as
it becomes confident on examples it gets wrong: the overconfidence that ECE measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.evaluation.margins import label_margin
from mtl_cog.evaluation.predictions import labelled_rows

MARGIN_QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def logit_hessian(layout: LogitLayout) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """-> (logits (B, L), vectors (B, L)) ↦ H · vectors: the Hessian of the summed batch-mean NLL of every task."""

    def apply(logits: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(vectors)
        batch = logits.shape[0]
        for task in range(layout.num_tasks):
            block = layout.task_slice(task)
            z, v = logits[:, block], vectors[:, block]
            if layout.widths[task] == 1:
                p = torch.sigmoid(z)
                out[:, block] = p * (1 - p) * v
            else:
                p = torch.softmax(z, dim=1)
                out[:, block] = p * v - p * (p * v).sum(1, keepdim=True)
        return out / batch

    return apply


class GaussNewton:
    """G-vector products of ``model`` on ``images`` (one forward pass, kept for every product)."""

    def __init__(self, model: nn.Module, images: torch.Tensor, layout: LogitLayout) -> None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        with torch.enable_grad():
            self.logits = model(images).float()
            if self.logits.ndim != 2 or self.logits.shape[1] != layout.total:
                raise ValueError(f"the network gives logits of shape {tuple(self.logits.shape)}; the task layout "
                                 f"expects (batch, {layout.total}).")
            self._dummy = torch.zeros_like(self.logits, requires_grad=True)
            # u ↦ Jᵀu, kept differentiable in u: its gradient in u against v is Jv
            transpose = torch.autograd.grad(self.logits, trainable, self._dummy, create_graph=True, allow_unused=True)
        used = [i for i, g in enumerate(transpose) if g is not None]  # parameters the logits do not depend on
        self.params = [trainable[i] for i in used]  # have zero rows in G: left out
        self._transpose = [transpose[i] for i in used]
        self._hessian = logit_hessian(layout)
        self._h_logits = self.logits.detach()

    def __call__(self, vector: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.enable_grad():
            (jv,) = torch.autograd.grad(self._transpose, self._dummy, vector, retain_graph=True)
            return list(torch.autograd.grad(self.logits, self.params, self._hessian(self._h_logits, jv),
                                            retain_graph=True))


def _dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


@dataclass
class Curvature:
    top_eigenvalue: float | None = None
    top_eigenvalue_iterations: int = 0
    trace: float | None = None
    trace_stderr: float | None = None


def _in_eval_mode(function):
    def wrapper(model: nn.Module, *args, **kwargs):
        was_training = model.training
        model.eval()
        try:
            return function(model, *args, **kwargs)
        finally:
            model.train(was_training)

    return wrapper


@_in_eval_mode
def top_eigenvalue(model: nn.Module, images: torch.Tensor, layout: LogitLayout, iterations: int = 20,
                   tol: float = 1e-3, seed: int = 0) -> tuple[float, int]:
    """λ_max of the GGN by power iteration -> (eigenvalue, products used)."""
    product = GaussNewton(model, images, layout)
    generator = torch.Generator().manual_seed(seed)
    vector = [torch.randn(p.shape, generator=generator).to(p) for p in product.params]
    norm = _dot(vector, vector) ** 0.5
    vector = [v / norm for v in vector]
    eigenvalue = 0.0
    for step in range(1, iterations + 1):
        image = product(vector)
        new = _dot(vector, image)  # Rayleigh quotient of the unit vector
        norm = _dot(image, image) ** 0.5
        if norm == 0:  # G = 0 (e.g. saturated predictions): every eigenvalue is 0
            return 0.0, step
        vector = [v / norm for v in image]
        if step > 1 and abs(new - eigenvalue) <= tol * abs(new):
            return new, step
        eigenvalue = new
    return eigenvalue, iterations


@_in_eval_mode
def hutchinson_trace(model: nn.Module, images: torch.Tensor, layout: LogitLayout, samples: int = 20,
                     seed: int = 0) -> tuple[float, float]:
    """tr(G) by Hutchinson's estimator with Rademacher vectors -> (estimate, standard error)."""
    product = GaussNewton(model, images, layout)
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(samples):
        vector = [(torch.randint(0, 2, p.shape, generator=generator) * 2 - 1).to(p) for p in product.params]
        values.append(_dot(vector, product(vector)))
    values = np.array(values)
    stderr = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), stderr


def signed_margins(logits: list[np.ndarray], labels: list[np.ndarray]) -> np.ndarray:
    """Every task's signed margin of the label, pooled: (2y − 1) z, or z_y − max_{k≠y} z_k; of the labelled
    (task, sample) entries only (an unknown label, ``MISSING_LABEL``, has no margin)."""
    return np.concatenate([label_margin(*labelled_rows(z, y)) for z, y in zip(logits, labels)])


def margin_quantiles(logits: list[np.ndarray], labels: list[np.ndarray],
                     quantiles: tuple[float, ...] = MARGIN_QUANTILES) -> dict[str, float]:
    """{"margin_q01": ..., "margin_q99": ...}: quantiles of the pooled signed margins."""
    margins = signed_margins(logits, labels)
    return {f"margin_q{round(100 * q):02d}": float(v) for q, v in zip(quantiles, np.quantile(margins, quantiles))}
