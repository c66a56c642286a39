"""Aligned-MTL (Senushkin et al., 2023): torchjd's weighting, applied to the shared backbone only.

Aligned-MTL (Senushkin et al., 2023, "Independent Component Alignment for Multi-Task Learning"):
the task gradients rotated to an orthogonal, equally scaled system (from the Gramian's
eigendecomposition), so no direction dominates.
"""

from __future__ import annotations

from torchjd.aggregation import AlignedMTLWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting


@AGGREGATORS.register("aligned_mtl")
class AlignedMTL(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, AlignedMTLWeighting())
