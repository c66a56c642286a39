"""Calibrators: logits (B, L) -> logits (B, L), the identity at initialisation.

The same class serves COG (trained jointly as the Stackelberg leader) and post-hoc calibration
(fitted on frozen validation logits by ``fit_calibrator`` below, through
``mtl_cog.evaluation.posthoc.LearnedScaling``); only the fitting differs. Per-task
parameters are broadcast to the flat logit layout with one gather, so 40 tasks cost one op.
To add a calibrator: one class here (or in its own module) with ``@CALIBRATORS.register(name)``.
"""

from __future__ import annotations

import warnings

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
    """One temperature per task (Guo et al., 2017): z / T_t, with T_t = exp(log_t) > 0.

    The parameter is log T, not T (T stays positive without a constraint). So COG-TS's leader
    step is a step in log T: Adam moves log T by about ``leader_lr`` per step, i.e. T by a
    *relative* amount, and its step in T scales with T (dT ~ T d log T). A leader rate means a
    relative rate here, and the same rate moves a large temperature further in absolute terms
    than a small one; the COG paper does not say how it parametrises T.
    """

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


def separated_tasks(logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout) -> list[int]:
    """Tasks whose (N, L) ``logits`` classify every labelled sample correctly with no tie (sign for a
    binary task, a unique argmax for a K-class one): no errors at all. Rows labelled ``MISSING_LABEL``
    do not count; a task without labelled rows is not separated (it has nothing to fit)."""
    out = []
    for t in range(layout.num_tasks):
        known = labels[:, t] != MISSING_LABEL
        if not bool(known.any()):
            continue
        block, y = logits[known][:, layout.task_slice(t)], labels[known, t]
        if block.shape[1] == 1:
            correct = torch.where(y == 1, block[:, 0] > 0, block[:, 0] < 0)
        else:
            top2 = block.topk(2, dim=1)
            correct = (top2.indices[:, 0] == y) & (top2.values[:, 0] > top2.values[:, 1])
        if bool(correct.all()):
            out.append(t)
    return out


def fit_calibrator(calibrator: nn.Module, logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout,
                   max_iter: int = 200, task_names: list[str] | tuple[str, ...] | None = None,
                   what: str = "calibrator") -> list[int]:
    """Fit ``calibrator`` (flat logits (N, L) -> (N, L)) to minimise the NLL by L-BFGS (exact optimum).

    ``labels`` is (N, T). The objective is the sum of the per-task NLLs: each task's parameters
    only see their own task's loss, so this is one independent fit per task, done at once.

    **Fits with no optimum.** Every calibrator fitted here can multiply its output logits by any
    c > 1 (TS: a smaller T; VS, MS: all parameters times c; stability scaling: a smaller base
    temperature). If the fitted calibrator classifies every validation sample of a task correctly,
    doing so lowers that task's NLL further, forever: the NLL has no minimum and the fit runs to
    the edge of its domain (T -> 0: ever more confident; on digits a T of 0.02 made the test NLL
    35 times worse). This is the separation of logistic regression, under which the maximum-
    likelihood estimate does not exist (Albert & Anderson, 1984, Biometrika 71(1)); conversely,
    when some sample is misclassified by every member of the family, a finite optimum exists. Such
    a task keeps the calibrator's parameters from before the fit (the identity for a fresh
    calibrator, i.e. its uncalibrated logits): its validation set holds no errors to calibrate on,
    and a warning names it. The other tasks are then refitted without it, so its divergence
    cannot stop their fit early. Returns the indices of those tasks.
    """
    before = {k: v.detach().clone() for k, v in calibrator.state_dict().items()}
    excluded: list[int] = []
    for _ in range(layout.num_tasks + 1):  # each round excludes at least one more task, or ends
        calibrator.load_state_dict(before)
        _lbfgs(calibrator, logits, labels, layout, max_iter, excluded)
        with torch.no_grad():
            separated = [t for t in separated_tasks(calibrator(logits), labels, layout) if t not in excluded]
        if not separated:
            break
        excluded = sorted([*excluded, *separated])
    if excluded:
        names = [task_names[t] if task_names is not None else f"#{t}" for t in excluded]
        warnings.warn(
            f"{what}: the validation predictions of task(s) {', '.join(map(str, names))} have no errors, so the fit "
            "has no optimum (the NLL keeps falling as the logits are scaled up: T -> 0). Those tasks keep the "
            "parameters they had before the fit (post-hoc: their uncalibrated logits; LiST: L unchanged).",
            stacklevel=2,
        )
    return excluded


def _lbfgs(calibrator: nn.Module, logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout, max_iter: int,
           excluded: list[int]) -> None:
    """L-BFGS with a strong-Wolfe line search on the summed NLL of the tasks not ``excluded``.

    An excluded task's parameters get no gradient, so they stay where they are.
    """
    kept = [t for t in range(layout.num_tasks) if t not in excluded]
    if not kept:
        return
    sub_layout = LogitLayout(tuple(layout.num_classes[t] for t in kept))
    columns = torch.cat([torch.arange(layout.task_slice(t).start, layout.task_slice(t).stop) for t in kept])
    sub_labels = labels[:, kept]
    optimizer = torch.optim.LBFGS(calibrator.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = task_nll(calibrator(logits)[:, columns.to(logits.device)], sub_labels, sub_layout)
        loss.backward()
        return loss

    optimizer.step(closure)


def fit_temperatures(layout: LogitLayout, logits: list[np.ndarray], labels: list[np.ndarray],
                     task_names: list[str] | tuple[str, ...] | None = None,
                     what: str = "temperature scaling") -> torch.Tensor:
    """(T,) per-task temperatures of post-hoc temperature scaling on these per-task logits and labels.

    NaN for a task whose fit has no optimum (no validation errors, see ``fit_calibrator``): there
    is no temperature to report, and a caller must not act on one.
    """
    calibrator = TemperatureCalibrator(layout).double()
    flat = torch.as_tensor(layout.join(logits), dtype=torch.float64)
    excluded = fit_calibrator(calibrator, flat, torch.as_tensor(np.stack(labels, axis=1), dtype=torch.long), layout,
                              task_names=task_names, what=what)
    temperatures = calibrator.temperature.detach().clone()
    temperatures[excluded] = float("nan")
    return temperatures
