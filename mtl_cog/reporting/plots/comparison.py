"""Figures that compare methods across runs, from the comparison tables (``mtl_cog.reporting.tables``).

Accuracy–NLL and accuracy–Brier Pareto fronts (Minderer et al., 2021) with the non-dominated
methods highlighted; per-task ECE as small multiples (one bar row per method, tasks in the same
order, shared axis), readable at 40 attributes and any number of methods; calibration error against
the number of bins (the paper's App. C.3: rankings move with bins); label-based against true
calibration error; each method's worst-calibrated tasks; LiST's accuracy–robustness front.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mtl_cog.reporting.plots.common import method_styles


def pareto_front(accuracy: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """Mask of non-dominated points: no other point has accuracy >= and loss <= with one strict."""
    accuracy, loss = np.asarray(accuracy, float), np.asarray(loss, float)
    dominated = ((accuracy[None, :] >= accuracy[:, None]) & (loss[None, :] <= loss[:, None])
                 & ((accuracy[None, :] > accuracy[:, None]) | (loss[None, :] < loss[:, None])))
    return ~dominated.any(axis=1)


def _label_points(ax, x: np.ndarray, y: np.ndarray, names: list[str], front: np.ndarray) -> None:
    """Name every point; points whose labels would collide share one stacked label.

    Points closer than ~12% of the x range and ~5% of the y range are grouped (names are wide,
    and calibrators such as vector and matrix scaling coincide exactly on binary tasks).
    """
    span_x = max(np.ptp(x), 1e-12)
    span_y = max(np.ptp(y), 1e-12)
    groups: list[list[int]] = []
    for i in np.argsort(-y):  # top to bottom
        for group in groups:
            j = group[0]
            if abs(x[i] - x[j]) / span_x < 0.12 and abs(y[i] - y[j]) / span_y < 0.05:
                group.append(i)
                break
        else:
            groups.append([i])
    for group in groups:
        anchor = group[0]
        text = "\n".join(f"{names[i]}{' ◆' if front[i] else ''}" for i in group)
        ax.annotate(text, (x[anchor], y[anchor]), xytext=(6, 4), textcoords="offset points", fontsize=8,
                    va="bottom", zorder=4, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                                 "alpha": 0.7})


OUTLIER_FENCE = 3.0  # interquartile ranges beyond the quartile: a point there is drawn clipped at the edge


def outlier_limit(values: np.ndarray, high: bool) -> float | None:
    """Where to clip an axis so one far-off point cannot squash the others; None when nothing is that far.

    A point is an outlier when it lies more than ``OUTLIER_FENCE`` interquartile ranges beyond the
    quartile on the bad side (``high``: large values, e.g. NLL; else small ones, e.g. accuracy).
    The limit leaves the other points 15 % of their span of room.
    """
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if len(values) < 4:
        return None
    q1, q3 = np.percentile(values, [25, 75])
    spread = max(q3 - q1, 1e-12)
    inside = values[values <= q3 + OUTLIER_FENCE * spread] if high else values[values >= q1 - OUTLIER_FENCE * spread]
    if len(inside) == len(values):
        return None
    span = max(np.ptp(inside), spread)
    return float(inside.max() + 0.15 * span) if high else float(inside.min() - 0.15 * span)


def pareto_figure(summary: pd.DataFrame, dataset: str) -> Figure:
    """Accuracy (x, higher is better) against NLL and Brier (y, lower is better), mean ± std over seeds.

    A method far worse than the rest (e.g. matrix scaling overfitting 100 classes) would squash
    every other point into a corner: such points are drawn as triangles on the clipped axis edge,
    with their value in a note under the panel (``outlier_limit``).
    """
    rows = summary[summary["dataset"] == dataset].reset_index(drop=True)
    styles = method_styles(list(rows["method"]))
    figure, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    for ax, metric, label in ((axes[0], "nll", "NLL (nats) ↓"), (axes[1], "brier", "Brier score ↓")):
        front = pareto_front(rows["accuracy"], rows[metric])
        y_limit = outlier_limit(rows[metric].to_numpy(), high=True)
        x_limit = outlier_limit(rows["accuracy"].to_numpy(), high=False)
        x_shown = rows["accuracy"].to_numpy(float) if x_limit is None else np.maximum(rows["accuracy"], x_limit)
        y_shown = rows[metric].to_numpy(float) if y_limit is None else np.minimum(rows[metric], y_limit)
        order = np.argsort(rows["accuracy"].to_numpy()[front])
        ax.plot(rows["accuracy"][front].to_numpy()[order], rows[metric][front].to_numpy()[order], "-", lw=6,
                color="#ffd92f", alpha=0.8, zorder=1, solid_capstyle="round", label="Pareto front")
        clipped = []
        for i, row in rows.iterrows():
            outside = x_shown[i] != row["accuracy"] or y_shown[i] != row[metric]
            xerr, yerr = (0, 0) if outside else (np.nan_to_num(row.get("accuracy_std", 0)),
                                                 np.nan_to_num(row.get(f"{metric}_std", 0)))
            style = styles[str(row["method"])]
            ax.errorbar(x_shown[i], y_shown[i], xerr=xerr, yerr=yerr,
                        fmt=">" if outside else style.marker, ms=9 if front[i] else 6, color=style.color, ecolor="0.6",
                        elinewidth=1, capsize=2, mec="black" if front[i] else style.color,
                        mew=1.5 if front[i] else 0.5, zorder=3, label=row["method"], clip_on=not outside)
            if outside:
                clipped.append(f"{row['method']} (accuracy {row['accuracy']:.3f}, {metric.upper()} {row[metric]:.3f})")
        _label_points(ax, x_shown, y_shown, list(rows["method"]), front)
        if clipped:
            ax.text(0.0, -0.16, "axes clipped; ▶ on the edge: " + "; ".join(clipped), transform=ax.transAxes,
                    fontsize=8, va="top", wrap=True)
        ax.set_xlabel("accuracy ↑")
        ax.set_ylabel(label)
        ax.set_title(f"{dataset}: accuracy vs {metric.upper() if metric == 'nll' else 'Brier'}")
        ax.grid(alpha=0.3)
        ax.margins(0.12)
        if y_limit is not None:
            ax.set_ylim(top=y_limit)
        if x_limit is not None:
            ax.set_xlim(left=x_limit)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9,
                  title="method\n(black ring and ◆:\non that panel's front)", title_fontsize=9)
    figure.tight_layout()
    return figure


def per_task_ece_figure(per_task: pd.DataFrame, dataset: str, metric: str = "ece@15") -> Figure:
    """One row of bars per method (tasks along x in data-set order), shared axes, ± std over seeds."""
    rows = per_task[per_task["dataset"] == dataset]
    methods = list(dict.fromkeys(rows["method"]))
    tasks = list(dict.fromkeys(rows["task"]))
    styles = method_styles(methods)
    figure, axes = plt.subplots(len(methods), 1, figsize=(max(8.0, 0.28 * len(tasks) + 2), 1.7 * len(methods) + 1.4),
                                sharex=True, sharey=True, squeeze=False)
    x = np.arange(len(tasks))
    for ax, method in zip(axes[:, 0], methods):
        values = rows[rows["method"] == method].set_index("task").reindex(tasks)
        std = values[f"{metric}_std"] if f"{metric}_std" in values else None
        ax.bar(x, values[metric], yerr=std, color=styles[method].color, ecolor="0.35", capsize=1.5, width=0.75)
        mean = values[metric].mean()
        ax.axhline(mean, color="black", ls="--", lw=0.8)
        ax.text(1.005, 0.5, f"{method}\nmean {mean:.3f}", transform=ax.transAxes, fontsize=9, va="center")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylabel(metric.upper().replace("@", "@"), fontsize=8)
    axes[-1, 0].set_xticks(x, tasks, rotation=90, fontsize=8)
    axes[-1, 0].set_xlim(-0.7, len(tasks) - 0.3)
    axes[-1, 0].set_xlabel("task")
    figure.suptitle(f"{dataset}: per-task {metric.upper()} by method (test, mean ± std over seeds; dashed: task mean)")
    figure.tight_layout()
    return figure


def bins_figure(errors: pd.DataFrame, dataset: str) -> Figure:
    """ECE, RMSCE, MCE (and the noise-free versions where known) against the number of bins."""
    rows = errors[errors["dataset"] == dataset]
    norms = [n for n in ("ece", "rmsce", "mce", "nf_ece", "nf_rmsce", "nf_mce") if n in set(rows["norm"])]
    methods = list(dict.fromkeys(rows.sort_values("method")["method"]))
    styles = method_styles(methods)
    cols = 3
    nrows = int(np.ceil(len(norms) / cols))
    figure, axes = plt.subplots(nrows, cols, figsize=(13, 3.8 * nrows), squeeze=False)
    for ax, norm in zip(axes.reshape(-1), norms):
        for method in methods:
            line = rows[(rows["norm"] == norm) & (rows["method"] == method)].sort_values("bins")
            ax.errorbar(line["bins"], line["mean"], yerr=line["std"], marker=styles[method].marker, ms=4, capsize=2,
                        color=styles[method].color, ls=styles[method].linestyle, label=method)
        ax.set_xscale("log")
        ticks = sorted(set(rows["bins"]))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("number of bins")
        title = norm.replace("nf_", "noise-free ").upper().replace("NOISE-FREE", "noise-free")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes.reshape(-1)[len(norms):]:
        ax.axis("off")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, title="method")
    figure.suptitle(f"{dataset}: calibration errors against the number of bins (test, mean ± std over seeds)")
    figure.tight_layout()
    return figure


def truth_figure(summary: pd.DataFrame, dataset: str, bins: int = 15) -> Figure:
    """Label-based ECE next to the noise-free calibration error and mean |p̂ − p*|, per method."""
    rows = summary[(summary["dataset"] == dataset) & summary[f"nf_ece@{bins}"].notna()].reset_index(drop=True)
    series = ((f"ece@{bins}", f"ECE@{bins} (labels)", "#4c72b0"),
              (f"nf_ece@{bins}", f"noise-free CE@{bins} (p*)", "#55a868"),
              ("prob_error", "mean |p̂ − p*|", "#c44e52"))
    figure, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.4))
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    for k, (column, label, color) in enumerate(series):
        ax.bar(x + (k - 1) * width, rows[column], width, yerr=rows[f"{column}_std"], color=color, capsize=2,
               label=label)
    ax.set_xticks(x, rows["method"], rotation=30 if len(rows) > 5 else 0, ha="right" if len(rows) > 5 else "center")
    ax.set_ylabel("error (probability units)")
    ax.set_xlabel("method")
    ax.set_title(f"{dataset}: label-based vs true calibration error (test, task mean, mean ± std over seeds)")
    ax.legend(fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure


def worst_tasks_figure(per_task: pd.DataFrame, dataset: str, metric: str = "ece@15", k: int = 10) -> Figure:
    """One panel per method: its ``k`` worst-calibrated tasks by ``metric``, sorted, worst on top."""
    rows = per_task[per_task["dataset"] == dataset]
    methods = list(dict.fromkeys(rows["method"]))
    styles = method_styles(methods)
    cols = min(3, len(methods))
    nrows = int(np.ceil(len(methods) / cols))
    figure, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 0.28 * k * nrows + 1.2 * nrows + 0.6),
                                sharex=True, squeeze=False)
    for ax, method in zip(axes.reshape(-1), methods):
        mine = rows[rows["method"] == method].sort_values(metric, ascending=False).head(k)
        y = np.arange(len(mine))[::-1]
        std = mine[f"{metric}_std"] if f"{metric}_std" in mine else None
        ax.barh(y, mine[metric], xerr=None if std is None else std.fillna(0), color=styles[method].color,
                ecolor="0.35", capsize=1.5, height=0.7)
        ax.set_yticks(y, mine["task"], fontsize=8)
        ax.tick_params(labelbottom=True)  # a shared axis, but every panel is read on its own
        ax.set_title(method, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.reshape(-1)[len(methods):]:
        ax.axis("off")
    figure.supxlabel(f"{metric.upper()} (test, mean over seeds; bar: std where there are 2+ seeds)")
    figure.suptitle(f"{dataset}: the {k} worst-calibrated tasks of each method")
    figure.tight_layout()
    return figure


def lipschitz_front_figure(front: pd.DataFrame, dataset: str, certified: str, ece: str = "ece@15") -> Figure:
    """LiST's front, one point per (method, loss margin), mean ± std over seeds.

    Left: accuracy (x) against certified robust accuracy (y), the colour the ECE, each point
    labelled with its margin. Right: accuracy, certified accuracy and ECE against the margin.
    ``front`` has columns method, margin, accuracy, ``certified``, ``ece`` (and ``<col>_std``).
    """
    rows = front.sort_values(["method", "margin"]).reset_index(drop=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    points = left.scatter(rows["accuracy"], rows[certified], c=rows[ece], cmap="viridis_r", s=70, zorder=3,
                          edgecolors="black")
    for method, group in rows.groupby("method", sort=False):
        left.plot(group["accuracy"], group[certified], "-", color="0.6", zorder=2, label=method)
        for _, row in group.iterrows():
            left.annotate(f"{method} m={row['margin']:g}", (row["accuracy"], row[certified]), fontsize=8,
                          xytext=(4, 4), textcoords="offset points")
    figure.colorbar(points, ax=left, label=f"{ece} ↓")
    left.set_xlabel("accuracy ↑")
    left.set_ylabel(f"certified robust accuracy ({certified}) ↑")
    left.set_title(f"{dataset}: accuracy vs certified accuracy (colour: ECE)")
    left.grid(alpha=0.3)
    left.margins(0.15)  # room for the labels
    styles = {"accuracy": "o-", certified: "s--", ece: "^:"}
    for method, group in rows.groupby("method", sort=False):
        for column, style in styles.items():
            right.errorbar(group["margin"], group[column], yerr=group.get(f"{column}_std"), fmt=style, capsize=2,
                           label=f"{method}: {column}")
    right.set_xlabel("loss margin (method.list_margin, logit units)")
    right.set_title(f"{dataset}: the front along the margin")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    figure.tight_layout()
    return figure
