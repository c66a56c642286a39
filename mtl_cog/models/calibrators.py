"""Calibrators: logits (B, L) -> logits (B, L), the identity at initialisation.

The same class serves COG (trained jointly as the Stackelberg leader) and post-hoc calibration
(fitted on frozen validation logits by ``fit_calibrator`` below, through
``mtl_cog.evaluation.posthoc.LearnedScaling``); only the fitting differs. Per-task
parameters are broadcast to the flat logit layout with one gather, so 40 tasks cost one op.
To add a calibrator: one class here (or in its own module) with ``@CALIBRATORS.register(name)``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.registry import Registry

CALIBRATORS: Registry[type[nn.Module]] = Registry("calibrator")


def _per_task(values: torch.Tensor, layout: LogitLayout, task_names: list[str]) -> dict[str, object]:
    """A per-column tensor (L,) -> {task: float (binary) or list (K-class)}."""
    flat = values.detach().cpu().double()
    out: dict[str, object] = {}
    for t, name in enumerate(task_names):
        block = flat[layout.task_slice(t)].tolist()
        out[name] = block[0] if len(block) == 1 else block
    return out


@CALIBRATORS.register("identity")
class IdentityCalibrator(nn.Module):
    """No calibration parameters (baseline, and COG-FC where the heads themselves lead)."""

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def by_task(self, task_names: list[str]) -> dict[str, dict[str, object]]:
        """The learned parameters per task, readable (none here)."""
        return {}

    def identity_distance(self) -> float | None:
        """Largest deviation of any parameter from its identity value (None: nothing to learn)."""
        return None


@CALIBRATORS.register("temperature")
class TemperatureCalibrator(nn.Module):
    """One temperature per task (Guo et al., 2017): z / T_t, with T_t = exp(log_t) > 0."""

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        self.layout = layout
        self.log_temperature = nn.Parameter(torch.zeros(layout.num_tasks))
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        inverse = torch.exp(-self.log_temperature)[self.column_task]
        return logits * inverse

    def by_task(self, task_names: list[str]) -> dict[str, dict[str, object]]:
        """{"temperature": {task: T}}."""
        temperatures = self.temperature.detach().cpu().double().tolist()
        return {"temperature": dict(zip(task_names, temperatures))}

    def identity_distance(self) -> float:
        return float((self.temperature.detach() - 1).abs().max())


@CALIBRATORS.register("vector")
class VectorCalibrator(nn.Module):
    """Vector scaling (Guo et al., 2017): a scale and a bias per logit column.

    For a binary task (one logit) this is Platt's affine map a*z + b.
    """

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        self.layout = layout
        self.scale = nn.Parameter(torch.ones(layout.total))
        self.bias = nn.Parameter(torch.zeros(layout.total))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.scale + self.bias

    def by_task(self, task_names: list[str]) -> dict[str, dict[str, object]]:
        """{"scale": {task: a or [a_k]}, "bias": {task: b or [b_k]}}."""
        return {"scale": _per_task(self.scale, self.layout, task_names),
                "bias": _per_task(self.bias, self.layout, task_names)}

    def identity_distance(self) -> float:
        return float(max((self.scale.detach() - 1).abs().max(), self.bias.detach().abs().max()))


@CALIBRATORS.register("matrix")
class MatrixCalibrator(nn.Module):
    """Matrix scaling (Guo et al., 2017): a K x K matrix and a K-bias per task, W z + b.

    A binary task (one logit) gets a 1 x 1 matrix, i.e. Platt's affine map. All tasks run as one
    matmul with a block-diagonal (L, L) matrix, assembled from only the sum of K_t^2 stored
    values, so the parameter count is exactly that of one matrix per task (no masked zeros).
    Unregularised, it overfits with many classes (the COG paper sees this on CIFAR-100).
    """

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        rows, cols, identity = [], [], []
        for t, width in enumerate(layout.widths):
            start = layout.offsets[t]
            for i in range(width):
                for j in range(width):
                    rows.append(start + i)
                    cols.append(start + j)
                    identity.append(1.0 if i == j else 0.0)
        self.layout = layout
        self.total = layout.total
        self._identity_values = identity
        self.weight = nn.Parameter(torch.tensor(identity))  # identity at initialisation
        self.bias = nn.Parameter(torch.zeros(layout.total))
        self.register_buffer("flat_index", torch.tensor(rows) * layout.total + torch.tensor(cols), persistent=False)

    def matrix(self) -> torch.Tensor:
        """The block-diagonal (L, L) matrix: row = output logit, column = input logit."""
        full = self.weight.new_zeros(self.total * self.total).index_put((self.flat_index,), self.weight)
        return full.view(self.total, self.total)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(logits, self.matrix(), self.bias)

    def by_task(self, task_names: list[str]) -> dict[str, dict[str, object]]:
        """{"matrix": {task: [[...]] (K x K; 1 x 1 for binary)}, "bias": {task: ...}}."""
        full = self.matrix().detach().cpu().double()
        blocks = {name: full[self.layout.task_slice(t), self.layout.task_slice(t)].tolist()
                  for t, name in enumerate(task_names)}
        return {"matrix": blocks, "bias": _per_task(self.bias, self.layout, task_names)}

    def identity_distance(self) -> float:
        identity = torch.tensor(self._identity_values, device=self.weight.device, dtype=self.weight.dtype)
        return float(max((self.weight.detach() - identity).abs().max(), self.bias.detach().abs().max()))


# ------------------------------------------------------------------------- fitting on frozen logits


def task_nll(logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout) -> torch.Tensor:
    """Sum over tasks of each task's mean NLL (binary: one logit; K-class: softmax), the fitting objective.

    The same numbers as ``mtl_cog.objectives.CrossEntropy(...).sum()`` (labels equal to ``MISSING_LABEL``
    left out, task by task); written here because fitting
    a calibrator is also needed below the objectives layer (LiST's scale update).
    """
    loss = logits.new_zeros(())
    if layout.binary_tasks:
        y = labels[:, list(layout.binary_tasks)]
        z = logits[:, layout.binary_columns.to(logits.device)]
        known = y != MISSING_LABEL
        if bool(known.all()):
            loss = loss + F.binary_cross_entropy_with_logits(z, y.to(z.dtype), reduction="none").mean(0).sum()
        else:  # partly labelled: each task's mean over its labelled rows (a task with none adds 0)
            per_sample = F.binary_cross_entropy_with_logits(z, torch.where(known, y, 0).to(z.dtype), reduction="none")
            count = known.sum(0).clamp(min=1).to(z.dtype)
            loss = loss + (torch.where(known, per_sample, 0.0).sum(0) / count).sum()
    for t in layout.multiclass_tasks:
        if bool((labels[:, t] != MISSING_LABEL).any()):  # cross_entropy skips MISSING_LABEL (its ignore_index)
            loss = loss + F.cross_entropy(logits[:, layout.task_slice(t)], labels[:, t], ignore_index=MISSING_LABEL)
    return loss


def fit_calibrator(calibrator: nn.Module, logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout,
                   max_iter: int = 200) -> nn.Module:
    """Fit ``calibrator`` (flat logits (N, L) -> (N, L)) to minimise the NLL by L-BFGS (exact optimum).

    ``labels`` is (N, T). The objective is the sum of the per-task NLLs: each task's parameters
    only see their own task's loss, so this is one independent fit per task, done at once.
    """
    optimizer = torch.optim.LBFGS(calibrator.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = task_nll(calibrator(logits), labels, layout)
        loss.backward()
        return loss

    optimizer.step(closure)
    return calibrator


def fit_temperatures(layout: LogitLayout, logits: list[np.ndarray], labels: list[np.ndarray]) -> torch.Tensor:
    """(T,) per-task temperatures of post-hoc temperature scaling on these per-task logits and labels."""
    calibrator = TemperatureCalibrator(layout).double()
    flat = torch.as_tensor(layout.join(logits), dtype=torch.float64)
    fit_calibrator(calibrator, flat, torch.as_tensor(np.stack(labels, axis=1), dtype=torch.long), layout)
    return calibrator.temperature.detach()
