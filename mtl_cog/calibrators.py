"""Calibrators: logits (B, L) -> logits (B, L), the identity at initialisation.

The same class serves COG (trained jointly as the Stackelberg leader) and post-hoc calibration
(fitted on frozen validation logits by ``fit_posthoc``); only the fitting differs. Per-task
parameters are broadcast to the flat logit layout with one gather, so 40 tasks cost one op.
To add a calibrator: one class here (or in its own module) with ``@CALIBRATORS.register(name)``.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.registry import Registry
from mtl_cog.task_api import LogitLayout

CALIBRATORS: Registry[type[nn.Module]] = Registry("calibrator")


@CALIBRATORS.register("identity")
class IdentityCalibrator(nn.Module):
    """No calibration parameters (baseline, and COG-FC where the heads themselves lead)."""

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@CALIBRATORS.register("temperature")
class TemperatureCalibrator(nn.Module):
    """One temperature per task (Guo et al., 2017): z / T_t, with T_t = exp(log_t) > 0."""

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(layout.num_tasks))
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        inverse = torch.exp(-self.log_temperature)[self.column_task]
        return logits * inverse


@CALIBRATORS.register("vector")
class VectorCalibrator(nn.Module):
    """Vector scaling (Guo et al., 2017): a scale and a bias per logit column.

    For a binary task (one logit) this is Platt's affine map a*z + b.
    """

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(layout.total))
        self.bias = nn.Parameter(torch.zeros(layout.total))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.scale + self.bias
