"""The report's figures (matplotlib, Agg backend: no display needed), one module per kind.

- ``reliability``: reliability diagrams of prediction files (binned, smoothed, count calibration),
  for one run and for a method's seeds pooled;
- ``comparison``: figures across runs from the comparison tables (Pareto fronts, per-task and
  worst-task ECE, errors against the number of bins, label-based vs true error, LiST's front);
- ``training``: what happened during training (calibration drift, the learned calibrator);
- ``common``: the PNG writer and one style per method (colour-blind-safe colour, marker, dash).

Binary tasks plot the positive-class probability against the label frequency, multi-class tasks
the top-label confidence against accuracy (the conventions of mtl_cog/evaluation/metrics.py).
Every figure is importable from here (``plots.reliability_figure``), as callers always did.
"""

import matplotlib

matplotlib.use("Agg")  # before any submodule imports pyplot: files only, never a window

from mtl_cog.reporting.plots.common import DPI, MethodStyle, method_colors, method_styles, save_figure  # noqa: E402
from mtl_cog.reporting.plots.comparison import (  # noqa: E402
    OUTLIER_FENCE,
    bins_figure,
    lipschitz_front_figure,
    outlier_limit,
    pareto_figure,
    pareto_front,
    per_task_ece_figure,
    truth_figure,
    worst_tasks_figure,
)
from mtl_cog.reporting.plots.reliability import (  # noqa: E402
    bin_count_strip,
    calibration_inputs,
    count_calibration_figure,
    reliability_comparison_figure,
    reliability_figure,
    reliability_panel,
    smooth_reliability_figure,
    smooth_reliability_panel,
)
from mtl_cog.reporting.plots.training import calibrator_figure, drift_figure  # noqa: E402

__all__ = [
    "DPI", "MethodStyle", "OUTLIER_FENCE", "bin_count_strip", "bins_figure", "calibration_inputs", "calibrator_figure",
    "count_calibration_figure", "drift_figure", "lipschitz_front_figure", "method_colors", "method_styles",
    "outlier_limit",
    "pareto_figure", "pareto_front", "per_task_ece_figure", "reliability_comparison_figure", "reliability_figure",
    "reliability_panel", "save_figure", "smooth_reliability_figure", "smooth_reliability_panel", "truth_figure",
    "worst_tasks_figure",
]
