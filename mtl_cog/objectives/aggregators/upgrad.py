"""UPGrad (Quinton & Rey, 2024): torchjd's weighting, applied to the shared backbone only.

UPGrad (Quinton & Rey, 2024, "Jacobian Descent for Multi-Objective Optimization"):
the mean of the task gradients, each first projected onto the dual cone of all of them, so no task's
loss increases to first order. With no conflict it is the mean.
"""

from __future__ import annotations

from torchjd.aggregation import UPGradWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting


@AGGREGATORS.register("upgrad")
class UPGrad(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, UPGradWeighting())
