"""Multi-task aggregators: per-task losses -> the shared backbone's gradient (one module per aggregator)."""

from mtl_cog.objectives.aggregators import (  # noqa: F401  (registration)
    aligned_mtl,
    imtl_g,
    mgda,
    pcgrad,
    uncertainty,
    upgrad,
)
from mtl_cog.objectives.aggregators.base import (
    AGGREGATORS,
    EQUAL,
    GramianWeighting,
    TaskAggregator,
    build_aggregator,
)

__all__ = ["AGGREGATORS", "EQUAL", "GramianWeighting", "TaskAggregator", "build_aggregator"]
