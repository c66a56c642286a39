"""The learned calibrator made visible: per-task values and a one-line summary every epoch.

In COG the calibrator is the Stackelberg leader with a small learning rate; if that rate is too
small it never leaves the identity and "COG-TS" is silently the baseline. So every epoch of
stage one logs the calibrator's per-task parameters (``metrics.jsonl`` key ``calibrator``), a
summary on the console and on W&B (``calibrator/...``), and the end of stage one says when the
calibrator stayed within ``IDENTITY_TOLERANCE`` of the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from accelerate import Accelerator
from torch import nn

from mtl_cog.constants import IDENTITY_TOLERANCE
from mtl_cog.data.task_api import TaskSpec


@dataclass
class CalibratorRecord:
    by_task: dict[str, dict[str, object]]  # {"temperature": {task: T}, ...}
    summary: dict[str, dict[str, float]]  # {"temperature": {"median": ..., "min": ..., "max": ...}, ...}

    def one_line(self) -> str:
        return "  ".join(f"{name} median {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"
                         for name, s in self.summary.items())


def _flat(value: object) -> list[float]:
    return np.asarray(value, dtype=np.float64).ravel().tolist()


def calibrator_record(model: nn.Module, spec: TaskSpec) -> CalibratorRecord | None:
    """The record of ``model.calibrator`` now; None when it has nothing to learn (identity)."""
    by_task = model.calibrator.by_task(list(spec.task_names))
    if not by_task:
        return None
    summary = {}
    for name, per_task in by_task.items():
        values = np.array([x for v in per_task.values() for x in _flat(v)])
        summary[name] = {"median": float(np.median(values)), "min": float(values.min()), "max": float(values.max())}
    return CalibratorRecord(by_task, summary)


def flag_identity_calibrator(accelerator: Accelerator, model: nn.Module) -> bool:
    """Say so (console) when a calibrator with parameters ended within ``IDENTITY_TOLERANCE`` of the identity."""
    distance = model.calibrator.identity_distance()
    if distance is None or distance >= IDENTITY_TOLERANCE:
        return False
    accelerator.print(
        f"warning: the calibrator never left the identity (largest change {distance:.2g} < {IDENTITY_TOLERANCE}): "
        "this run is effectively uncalibrated. Its leader learning rate (optim.leader_lr) is probably too small."
    )
    return True


def task_weights_line(weights: list[float]) -> str:
    """The console line of an epoch's mean task weights (``mtl.aggregator``), shown like a calibrator's values:
    median [min, max] over tasks, and the weights' sum (the mean is 1/T per task, MGDA's sum is 1)."""
    w = np.asarray(weights, dtype=np.float64)
    return f"median {np.median(w):.4g} [{w.min():.4g}, {w.max():.4g}], sum {w.sum():.4g}"
