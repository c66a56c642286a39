"""IMTL-G (Liu et al., 2021): torchjd's weighting, applied to the shared backbone only.

IMTL-G (Liu et al., 2021, "Towards Impartial Multi-task Learning"):
the combination whose projections onto every unit task gradient are equal. Weights sum to 1.
"""

from __future__ import annotations

from torchjd.aggregation import IMTLGWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting


@AGGREGATORS.register("imtl_g")
class IMTLG(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, IMTLGWeighting())
