"""The report's figures (matplotlib, Agg backend: no display needed).

- reliability diagrams (Guo et al., 2017 style) per method: one panel per task and one for all
  tasks pooled (each task contributes its N predictions, so the pool weighs tasks equally, like
  the unweighted task mean); where p* is known, the bin's mean true probability is drawn too;
- accuracy–NLL and accuracy–Brier Pareto fronts across methods (Minderer et al., 2021), the
  non-dominated methods highlighted;
- per-task ECE as small multiples (one bar row per method, tasks in the same order, shared
  axis), which stays readable at 40 attributes and any number of methods;
- calibration error against the number of bins (the paper's App. C.3: rankings move with bins).

Binary tasks plot the positive-class probability against the label frequency, multi-class tasks
the top-label confidence against accuracy (the conventions of mtl_cog/metrics.py).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from scipy.special import expit, softmax  # noqa: E402

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.metrics import CLAMP  # noqa: E402
from mtl_cog.evaluation.predictions import Predictions  # noqa: E402
from mtl_cog.io import atomic_write  # noqa: E402

DPI = 110


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write a PNG atomically and close the figure (figures are large; never keep them open)."""
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight"))
    plt.close(figure)
    return Path(path)


def method_colors(methods: list[str]) -> dict[str, tuple]:
    """The same colour for a method in every figure of a data set (assigned in sorted order)."""
    ordered = sorted(set(methods))
    cmap = plt.get_cmap("tab10" if len(ordered) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(ordered)}


# ---------------------------------------------------------------------------------------------
# Reliability diagrams


def calibration_inputs(logits: np.ndarray, labels: np.ndarray,
                       true_probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """-> (probability, outcome, p* of the same event or None) for one task."""
    if np.ndim(logits) == 1:
        return expit(logits.astype(np.float64)), labels.astype(np.float64), true_probs
    p = softmax(logits.astype(np.float64), axis=1)
    predicted = p.argmax(1)
    rows = np.arange(len(p))
    truth = None if true_probs is None or np.ndim(true_probs) != 2 else true_probs[rows, predicted]
    return p[rows, predicted], (predicted == labels).astype(np.float64), truth


def _pool(predictions: list[Predictions], task: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, bool]:
    """Concatenate a task (or every task, ``task=None``) over the seeds' prediction files."""
    parts = []
    for pred in predictions:
        for t in range(len(pred.task_names)) if task is None else [task]:
            truth = None if pred.true_probs is None else pred.true_probs[t]
            parts.append(calibration_inputs(pred.logits[t], pred.labels[t], truth))
    binary = all(np.ndim(pred.logits[t]) == 1 for pred in predictions
                 for t in (range(len(pred.task_names)) if task is None else [task]))
    truth = None if any(p[2] is None for p in parts) else np.concatenate([p[2] for p in parts])
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), truth, binary


def reliability_panel(ax, prob: np.ndarray, outcome: np.ndarray, n_bins: int, truth: np.ndarray | None = None,
                      title: str = "", small: bool = False, ece_label: str = "ECE") -> float:
    """Bars: observed frequency per bin; red: the gap to the bin's mean probability; dots: mean p*. -> ECE."""
    conf = np.clip(prob, CLAMP, 1 - CLAMP)
    index = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    safe = np.maximum(count, 1)
    mean_p = np.bincount(index, conf, n_bins) / safe
    freq = np.bincount(index, outcome, n_bins) / safe
    filled = count > 0
    left = np.arange(n_bins) / n_bins
    width = 1 / n_bins
    ax.bar(left[filled], freq[filled], width=width, align="edge", color="#4c72b0", edgecolor="white", lw=0.5,
           label="observed frequency")
    # hatched, nearly transparent gap: where the model is underconfident (frequency above the mean
    # prediction) the blue bar stays visible under it
    ax.bar(left[filled], (mean_p - freq)[filled], bottom=freq[filled], width=width, align="edge",
           facecolor=(0.87, 0.33, 0.32, 0.18), edgecolor="#c44e52", hatch="////", lw=0.6,
           label="gap to mean prediction")
    ax.plot([0, 1], [0, 1], ls="--", color="0.3", lw=1, label="perfect calibration")
    if truth is not None:
        mean_truth = np.bincount(index, truth, n_bins) / safe
        ax.plot(mean_p[filled], mean_truth[filled], "o", ms=2.5 if small else 4, color="black",
                label="mean true probability p*")
    ece = float((np.abs(mean_p - freq) * count / len(conf)).sum())
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_title(f"{title}\n{ece_label}@{n_bins} {ece:.3f}" if title else f"{ece_label}@{n_bins} {ece:.3f}",
                 fontsize=8 if small else 10)
    ax.tick_params(labelsize=7 if small else 9)
    return ece


def _axis_labels(binary: bool) -> tuple[str, str]:
    if binary:
        return "predicted P(y=1)", "fraction positive"
    return "confidence (top label)", "accuracy"


def _grid_columns(panels: int) -> int:
    """Columns (4 to 8) that leave the fewest empty slots in the last row; wider on ties."""
    if panels <= 4:
        return panels
    return min(range(4, 9), key=lambda c: (-(-panels // c) * c - panels, -c))


def reliability_figure(predictions: list[Predictions], title: str, n_bins: int = SUMMARY_BINS) -> Figure:
    """One method: a panel per task plus all tasks pooled (multi-task), or one panel (single task).

    ``predictions`` holds one prediction file per seed (same tasks); they are pooled.
    """
    names = predictions[0].task_names
    suffix = f"{len(predictions)} seeds pooled" if len(predictions) > 1 else "1 run"
    if len(names) == 1:
        figure, ax = plt.subplots(figsize=(4.6, 4.8))
        prob, outcome, truth, binary = _pool(predictions, 0)
        reliability_panel(ax, prob, outcome, n_bins, truth, f"{title}: {names[0]} ({suffix})")
        xlabel, ylabel = _axis_labels(binary)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left", fontsize=7, framealpha=0.9)
        return figure
    panels = len(names) + 1
    cols = _grid_columns(panels)
    rows = int(np.ceil(panels / cols))
    figure, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.1 * rows + 0.9), squeeze=False)
    flat = axes.reshape(-1)
    prob, outcome, truth, binary = _pool(predictions, None)
    reliability_panel(flat[0], prob, outcome, n_bins, truth, "ALL TASKS POOLED", small=True, ece_label="pooled ECE")
    flat[0].title.set_fontweight("bold")
    for t, name in enumerate(names):
        prob, outcome, truth, _ = _pool(predictions, t)
        reliability_panel(flat[t + 1], prob, outcome, n_bins, truth, name, small=True)
    for ax in flat[panels:]:
        ax.axis("off")
    for i, ax in enumerate(flat[:panels]):  # tick labels only on the left column and the lowest panels
        ax.tick_params(labelbottom=i + cols >= panels, labelleft=i % cols == 0)
    xlabel, ylabel = _axis_labels(binary)
    figure.supxlabel(xlabel)
    figure.supylabel(ylabel)
    handles, labels = flat[0].get_legend_handles_labels()
    figure.suptitle(f"Reliability: {title} ({suffix}, test set)", fontsize=13, y=1.0)
    figure.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9, frameon=False,
                  bbox_to_anchor=(0.5, 0.985))
    figure.tight_layout(rect=(0.02, 0.02, 1, 0.965))
    return figure


def reliability_comparison_figure(pooled: dict[str, list[Predictions]], dataset: str,
                                  n_bins: int = SUMMARY_BINS) -> Figure:
    """All methods of a data set side by side, each panel pooled over tasks and seeds."""
    methods = list(pooled)
    cols = min(4, len(methods))
    rows = int(np.ceil(len(methods) / cols))
    figure, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.5 * rows + 0.6), squeeze=False)
    flat = axes.reshape(-1)
    binary = True
    for ax, method in zip(flat, methods):
        prob, outcome, truth, binary = _pool(pooled[method], None)
        reliability_panel(ax, prob, outcome, n_bins, truth, method,
                          ece_label="pooled ECE" if len(pooled[method][0].task_names) > 1 else "ECE")
    for ax in flat[len(methods):]:
        ax.axis("off")
    xlabel, ylabel = _axis_labels(binary)
    figure.supxlabel(xlabel)
    figure.supylabel(ylabel)
    handles, labels = flat[0].get_legend_handles_labels()
    figure.suptitle(f"Reliability on {dataset} (all tasks and seeds pooled, test set)", y=1.0)
    figure.legend(handles, labels, loc="upper center", ncol=min(4, len(labels)), fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, 0.975))
    figure.tight_layout(rect=(0.02, 0.02, 1, 0.93 if rows == 1 else 0.96))
    return figure


# ---------------------------------------------------------------------------------------------
# Pareto fronts


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


def pareto_figure(summary: pd.DataFrame, dataset: str) -> Figure:
    """Accuracy (x, higher is better) against NLL and Brier (y, lower is better), mean ± std over seeds."""
    rows = summary[summary["dataset"] == dataset].reset_index(drop=True)
    colors = method_colors(list(rows["method"]))
    figure, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    for ax, metric, label in ((axes[0], "nll", "NLL (nats) ↓"), (axes[1], "brier", "Brier score ↓")):
        front = pareto_front(rows["accuracy"], rows[metric])
        order = np.argsort(rows["accuracy"].to_numpy()[front])
        ax.plot(rows["accuracy"][front].to_numpy()[order], rows[metric][front].to_numpy()[order], "-", lw=6,
                color="#ffd92f", alpha=0.8, zorder=1, solid_capstyle="round", label="Pareto front")
        for i, row in rows.iterrows():
            ax.errorbar(row["accuracy"], row[metric], xerr=row.get("accuracy_std", 0), yerr=row.get(f"{metric}_std", 0),
                        fmt="o", ms=9 if front[i] else 6, color=colors[row["method"]], ecolor="0.6", elinewidth=1,
                        capsize=2, mec="black" if front[i] else colors[row["method"]], mew=1.5 if front[i] else 0.5,
                        zorder=3, label=row["method"])
        _label_points(ax, rows["accuracy"].to_numpy(), rows[metric].to_numpy(), list(rows["method"]), front)
        ax.set_xlabel("accuracy ↑")
        ax.set_ylabel(label)
        ax.set_title(f"{dataset}: accuracy vs {metric.upper() if metric == 'nll' else 'Brier'}")
        ax.grid(alpha=0.3)
        ax.margins(0.12)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9,
                  title="method\n(black ring and ◆:\non that panel's front)", title_fontsize=9)
    figure.tight_layout()
    return figure


# ---------------------------------------------------------------------------------------------
# Per-task calibration errors and the dependence on the number of bins


def per_task_ece_figure(per_task: pd.DataFrame, dataset: str, metric: str = "ece@15") -> Figure:
    """One row of bars per method (tasks along x in data-set order), shared axes, ± std over seeds."""
    rows = per_task[per_task["dataset"] == dataset]
    methods = list(dict.fromkeys(rows["method"]))
    tasks = list(dict.fromkeys(rows["task"]))
    colors = method_colors(methods)
    figure, axes = plt.subplots(len(methods), 1, figsize=(max(8.0, 0.28 * len(tasks) + 2), 1.7 * len(methods) + 1.4),
                                sharex=True, sharey=True, squeeze=False)
    x = np.arange(len(tasks))
    for ax, method in zip(axes[:, 0], methods):
        values = rows[rows["method"] == method].set_index("task").reindex(tasks)
        std = values[f"{metric}_std"] if f"{metric}_std" in values else None
        ax.bar(x, values[metric], yerr=std, color=colors[method], ecolor="0.35", capsize=1.5, width=0.75)
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
    colors = method_colors(methods)
    cols = 3
    nrows = int(np.ceil(len(norms) / cols))
    figure, axes = plt.subplots(nrows, cols, figsize=(13, 3.8 * nrows), squeeze=False)
    for ax, norm in zip(axes.reshape(-1), norms):
        for method in methods:
            line = rows[(rows["norm"] == norm) & (rows["method"] == method)].sort_values("bins")
            ax.errorbar(line["bins"], line["mean"], yerr=line["std"], marker="o", ms=4, capsize=2,
                        color=colors[method], label=method)
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


# ---------------------------------------------------------------------------------------------
# LiST: the accuracy-robustness-calibration front over the loss margin


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
