"""Training objectives: one module per loss, each registered in ``OBJECTIVES`` on import."""

from mtl_cog.objectives import (  # noqa: F401  (registration)
    cross_entropy,
    fedlas,
    focal,
    label_smoothing,
    margin,
    margin_ce,
    mbls,
)
from mtl_cog.objectives.auxiliary import WithAuxiliaryLoss
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss, build_objective, set_partial_labels
from mtl_cog.objectives.cross_entropy import CrossEntropy

__all__ = ["OBJECTIVES", "CrossEntropy", "PerTaskLoss", "WithAuxiliaryLoss", "build_objective", "set_partial_labels"]
