"""Figures of what happened during training: calibration drift over epochs, and the learned calibrator.

``drift_figure`` draws ``scripts/calibration_drift.py``'s lines (ECE next to sharpness and margins
over epochs); ``calibrator_figure`` the per-task calibrator parameters read back from
``metrics.jsonl`` (``mtl_cog.bundles.trajectories``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mtl_cog.constants import IDENTITY_VALUES, SUMMARY_BINS
from mtl_cog.reporting.plots.common import method_styles


def drift_figure(lines: list[dict], title: str, ece_key: str = f"val_ece@{SUMMARY_BINS}") -> Figure:
    """ECE beside sharpness, margins and the fitted temperature over epochs (scripts/calibration_drift.py).

    ``lines`` are the JSON lines of calibration_drift.py; panels without their keys are left out.
    """
    epochs = [line["epoch"] for line in lines]

    def series(key: str) -> np.ndarray | None:
        values = [line.get(key) for line in lines]
        return None if all(v is None for v in values) else np.array([np.nan if v is None else v for v in values])

    panels = [("calibration (validation)", [(ece_key, ece_key.removeprefix("val_").upper()),
                                            ("val_smece", "smooth ECE")], "error", False),
              ("curvature of the training NLL (fixed batch)",
               [("ggn_top_eigenvalue", "GGN top eigenvalue"), ("ggn_trace", "GGN trace (Hutchinson)")], "", True),
              ("signed margins of the labels (validation, all tasks pooled)",
               [(f"val_margin_q{q:02d}", f"{q}{'st' if q == 1 else 'th'} percentile") for q in (1, 5, 50, 95, 99)],
               "logit units", False),
              ("post-hoc temperature fitted on validation", [("fitted_T_median", "median over tasks")], "T", False)]
    panels = [p for p in panels if any(series(key) is not None for key, _ in p[1])]
    figure, axes = plt.subplots(len(panels), 1, figsize=(7.5, 2.4 * len(panels) + 0.8), sharex=True, squeeze=False)
    for ax, (name, keys, ylabel, log) in zip(axes[:, 0], panels):
        for key, label in keys:
            values = series(key)
            if values is not None:
                ax.plot(epochs, values, "o-", ms=3, label=label)
        if log:
            ax.set_yscale("log")
        if name.startswith("signed margins"):
            ax.axhline(0, color="0.3", lw=0.8, ls="--")
        if name.startswith("post-hoc"):
            ax.axhline(1, color="0.3", lw=0.8, ls="--")
            ax.text(0.99, 0.95, "T > 1: overconfident, T < 1: underconfident", transform=ax.transAxes, fontsize=8,
                    va="top", ha="right")
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best", ncol=2 if len(keys) > 3 else 1)
    axes[-1, 0].set_xlabel("epoch")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return figure


def calibrator_figure(trajectories: pd.DataFrame, dataset: str,
                      identity_flags: dict[str, bool] | None = None) -> Figure:
    """Per calibrator parameter (a row): the last epoch's value per task, and the values over epochs.

    ``trajectories``: columns method, seed, epoch, parameter, task, value (mtl_cog.bundles.trajectories).
    Left: tasks sorted by the value, mean over seeds with their range. Right: median over tasks per
    epoch, the band spanning all tasks. The dashed line is the identity; a method whose calibrator
    never left it is marked "(at identity)" in the legend.
    """
    parameters = list(dict.fromkeys(trajectories["parameter"]))
    methods = sorted(set(trajectories["method"]))
    styles = method_styles(methods)
    flags = identity_flags or {}
    figure, axes = plt.subplots(len(parameters), 2, figsize=(13, 3.9 * len(parameters)), squeeze=False)
    for row, parameter in enumerate(parameters):
        rows = trajectories[trajectories["parameter"] == parameter]
        across, over = axes[row]
        for method in methods:
            mine = rows[rows["method"] == method]
            if mine.empty:
                continue
            label = f"{method}{' (at identity)' if flags.get(method) else ''}"
            last = mine[mine["epoch"] == mine.groupby("seed")["epoch"].transform("max")]
            per_task = last.groupby("task")["value"].agg(["mean", "min", "max"]).sort_values("mean")
            x = np.arange(len(per_task))
            across.errorbar(x, per_task["mean"], yerr=[per_task["mean"] - per_task["min"],
                                                       per_task["max"] - per_task["mean"]],
                            fmt=styles[method].marker, ls=styles[method].linestyle, ms=3, lw=1, capsize=1.5,
                            color=styles[method].color, label=label)
            by_epoch = mine.groupby("epoch")["value"]
            epochs = np.array(sorted(mine["epoch"].unique()))
            over.plot(epochs, by_epoch.median().loc[epochs], color=styles[method].color, ls=styles[method].linestyle,
                      marker=styles[method].marker, ms=3, lw=1.5, label=label)
            over.fill_between(epochs, by_epoch.min().loc[epochs], by_epoch.max().loc[epochs],
                              color=styles[method].color,
                              alpha=0.15, lw=0)
        for ax in (across, over):
            if parameter in IDENTITY_VALUES:
                ax.axhline(IDENTITY_VALUES[parameter], color="0.3", ls="--", lw=1)
            ax.grid(alpha=0.3)
            ax.set_ylabel(parameter)
        many = len(set(rows["task"])) > 1
        across.set_xlabel("tasks, sorted by the learned value" if many else "task")
        if len(set(rows["task"])) <= 12:
            ticks = rows.groupby("task")["value"].mean().sort_values().index
            across.set_xticks(np.arange(len(ticks)), ticks, rotation=45, ha="right", fontsize=8)
        across.set_title(f"{parameter} at the last epoch, per task (mean and range over seeds)", fontsize=10)
        over.set_xlabel("epoch")
        over.set_title(f"{parameter} over epochs (median over tasks; band: all tasks)", fontsize=10)
    handles, labels = axes[0, 1].get_legend_handles_labels()
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9,
                  title="method (dashed: identity)")
    figure.suptitle(f"{dataset}: the learned calibrator")
    figure.tight_layout()
    return figure
