"""MGDA (Désidéri, 2012; Sener & Koltun, 2018): torchjd's weighting, applied to the shared backbone only.

MGDA (Désidéri, 2012; for deep multi-task learning and CelebA-40:
Sener & Koltun, 2018): the minimum-norm point of the convex hull of the task gradients, a common
descent direction (a Pareto-stationary point gives 0). Weights sum to 1.
"""

from __future__ import annotations

from torchjd.aggregation import MGDAWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting


@AGGREGATORS.register("mgda")
class MGDA(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, MGDAWeighting())
