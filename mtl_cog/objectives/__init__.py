"""Training objectives: one module per loss, each registered in ``OBJECTIVES`` on import."""

from mtl_cog.objectives import cross_entropy, focal, label_smoothing  # noqa: F401  (registration)
from mtl_cog.objectives.auxiliary import WithAuxiliaryLoss
from mtl_cog.objectives.base import OBJECTIVES, PerTaskLoss, build_objective
from mtl_cog.objectives.cross_entropy import CrossEntropy

__all__ = ["OBJECTIVES", "CrossEntropy", "PerTaskLoss", "WithAuxiliaryLoss", "build_objective"]
