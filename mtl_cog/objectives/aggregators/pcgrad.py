"""PCGrad (Yu et al., 2020): torchjd's weighting, applied to the shared backbone only.

PCGrad (Yu et al., 2020, "Gradient Surgery for Multi-Task Learning"):
each task gradient is projected off the normal plane of every conflicting one, then summed.
torchjd's deterministic form (every pair, fixed order); the sum makes the step about T times the
mean's, which Adam normalises away.
"""

from __future__ import annotations

from torchjd.aggregation import PCGradWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting


@AGGREGATORS.register("pcgrad")
class PCGrad(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, PCGradWeighting())
