"""The report's figures (matplotlib, Agg backend: no display needed).

- reliability diagrams (Guo et al., 2017 style) per method: one panel per task and one for all
  tasks pooled (each task contributes its N predictions, so the pool weighs tasks equally, like
  the unweighted task mean); where p* is known, the bin's mean true probability is drawn too;
- accuracy–NLL and accuracy–Brier Pareto fronts across methods (Minderer et al., 2021), the
  non-dominated methods highlighted;
- per-task ECE as small multiples (one bar row per method, tasks in the same order, shared
  axis), which stays readable at 40 attributes and any number of methods;
- calibration error against the number of bins (the paper's App. C.3: rankings move with bins);
- smoothed reliability diagrams (relplot's kernel regression at the smooth-ECE bandwidth, the
  diagram that goes with ``smece``), count-calibration curves (expected vs actual number of
  positive attributes per image, mtl_cog.evaluation.multitask_metrics) and the calibration-drift
  figure of ``scripts/calibration_drift.py`` (ECE next to sharpness and margins over epochs).

Binary tasks plot the positive-class probability against the label frequency, multi-class tasks
the top-label confidence against accuracy (the conventions of mtl_cog/evaluation/metrics.py).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import relplot  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from scipy.special import expit, softmax  # noqa: E402

from mtl_cog.constants import IDENTITY_VALUES, SUMMARY_BINS  # noqa: E402
from mtl_cog.evaluation.binning import CLAMP, bin_sums, errors_from_sums, uniform_bin_index  # noqa: E402
from mtl_cog.evaluation.multitask_metrics import count_calibration  # noqa: E402
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
                      title: str = "", small: bool = False, ece_label: str = "ECE", counts: bool = True) -> float:
    """Bars: observed frequency per bin; red: the gap to the bin's mean probability; dots: mean p*. -> ECE.

    With ``counts``, a strip under the diagram shows how many predictions fall in each bin (log
    scale): a large gap in a bin of 3 predictions is noise, in a bin of 3,000 it is miscalibration.
    """
    conf = np.clip(np.asarray(prob, dtype=np.float64), CLAMP, 1 - CLAMP)
    index = uniform_bin_index(conf, n_bins)  # the bins of ece@B (mtl_cog.evaluation.binning)
    sums = bin_sums(conf[None], np.asarray(outcome, dtype=np.float64)[None], index[None], n_bins)
    count, hits, confs = sums[0].T
    safe = np.maximum(count, 1)
    mean_p, freq = confs / safe, hits / safe
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
    ece = float(errors_from_sums(sums)["ece"][0])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_title(f"{title}\n{ece_label}@{n_bins} {ece:.3f}" if title else f"{ece_label}@{n_bins} {ece:.3f}",
                 fontsize=8 if small else 10)
    ax.tick_params(labelsize=7 if small else 9)
    if counts:
        bin_count_strip(ax, left, width, count.astype(np.int64), small)
    return ece


def bin_count_strip(ax, left: np.ndarray, width: float, count: np.ndarray, small: bool = False) -> None:
    """The number of predictions per bin, as grey bars on a log axis in a strip under ``ax``."""
    # below the diagram's tick labels (the strip shares its x axis and shows no labels of its own)
    strip = ax.inset_axes((0.0, -0.42 if small else -0.3, 1.0, 0.18 if small else 0.15), sharex=ax)
    filled = count > 0
    strip.bar(left[filled], count[filled], width=width, align="edge", color="0.55", edgecolor="white", lw=0.4)
    strip.set_yscale("log")
    strip.set_ylim(0.8, max(count.max(), 1) * 1.5)
    strip.tick_params(labelbottom=False, left=False, labelleft=False, which="both")
    strip.text(0.01, 1.0, f"predictions per bin (log), max {count.max():,}", transform=strip.transAxes,
               fontsize=5.5 if small else 7, va="bottom", color="0.3")


def _axis_labels(binary: bool) -> tuple[str, str]:
    if binary:
        return "predicted P(y=1)", "fraction positive"
    return "confidence (top label)", "accuracy"


def _grid_columns(panels: int) -> int:
    """Columns (4 to 8) that leave the fewest empty slots in the last row; wider on ties."""
    if panels <= 4:
        return panels
    return min(range(4, 9), key=lambda c: (-(-panels // c) * c - panels, -c))


def _panel_grid(panels: int, row_height: float, single_size: tuple[float, float] = (4.6, 5.6)):
    """A grid of ``panels`` axes (unused cells hidden) -> (figure, flat axes, columns)."""
    cols = _grid_columns(panels)
    rows = int(np.ceil(panels / cols))
    size = single_size if panels == 1 else (1.9 * cols, row_height * rows + 0.9)
    figure, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    flat = axes.reshape(-1)
    for ax in flat[panels:]:
        ax.axis("off")
    return figure, flat, cols


def _task_panels(flat, predictions: list[Predictions], draw) -> bool:
    """All tasks pooled in the first panel (bold title), then one panel per task; -> whether tasks are binary.

    ``draw(ax, prob, outcome, truth, title, pooled)`` draws one panel.
    """
    prob, outcome, truth, binary = _pool(predictions, None)
    draw(flat[0], prob, outcome, truth, "ALL TASKS POOLED", True)
    flat[0].title.set_fontweight("bold")
    for t, name in enumerate(predictions[0].task_names):
        prob, outcome, truth, _ = _pool(predictions, t)
        draw(flat[t + 1], prob, outcome, truth, name, False)
    return binary


def _grid_labels_and_legend(figure: Figure, flat, binary: bool, heading: str) -> None:
    """Shared axis labels, the heading, and the first panel's legend above the grid."""
    xlabel, ylabel = _axis_labels(binary)
    figure.supxlabel(xlabel)
    figure.supylabel(ylabel)
    handles, labels = flat[0].get_legend_handles_labels()
    figure.suptitle(heading, fontsize=13, y=1.0)
    figure.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9, frameon=False,
                  bbox_to_anchor=(0.5, 0.985))


def reliability_figure(predictions: list[Predictions], title: str, n_bins: int = SUMMARY_BINS) -> Figure:
    """One method: a panel per task plus all tasks pooled (multi-task), or one panel (single task).

    ``predictions`` holds one prediction file per seed (same tasks); they are pooled.
    """
    names = predictions[0].task_names
    suffix = f"{len(predictions)} seeds pooled" if len(predictions) > 1 else "1 run"
    if len(names) == 1:
        figure, ax = plt.subplots(figsize=(4.6, 5.6))
        prob, outcome, truth, binary = _pool(predictions, 0)
        reliability_panel(ax, prob, outcome, n_bins, truth, f"{title}: {names[0]} ({suffix})")
        xlabel, ylabel = _axis_labels(binary)
        figure.supxlabel(xlabel, y=0.01)  # under the bin-count strip, which sits below the diagram's ticks
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left", fontsize=7, framealpha=0.9)
        figure.subplots_adjust(left=0.15, right=0.97, top=0.9, bottom=0.3)
        return figure
    panels = len(names) + 1
    figure, flat, cols = _panel_grid(panels, row_height=2.6)
    binary = _task_panels(flat, predictions, lambda ax, prob, outcome, truth, name, pooled: reliability_panel(
        ax, prob, outcome, n_bins, truth, name, small=True, **({"ece_label": "pooled ECE"} if pooled else {})))
    for i, ax in enumerate(flat[:panels]):  # tick labels only on the left column and the lowest panels
        ax.tick_params(labelbottom=i + cols >= panels, labelleft=i % cols == 0)
    _grid_labels_and_legend(figure, flat, binary, f"Reliability: {title} ({suffix}, test set)")
    figure.tight_layout(rect=(0.02, 0.05, 1, 0.965), h_pad=3.5)  # h_pad: room for the bin-count strips
    return figure


def reliability_comparison_figure(pooled: dict[str, list[Predictions]], dataset: str,
                                  n_bins: int = SUMMARY_BINS) -> Figure:
    """All methods of a data set side by side, each panel pooled over tasks and seeds."""
    methods = list(pooled)
    cols = min(4, len(methods))
    rows = int(np.ceil(len(methods) / cols))
    figure, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 4.1 * rows + 0.6), squeeze=False)
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
    figure.tight_layout(rect=(0.02, 0.1 if rows == 1 else 0.05, 1, 0.93 if rows == 1 else 0.96), h_pad=3.0)
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
    colors = method_colors(list(rows["method"]))
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
            ax.errorbar(x_shown[i], y_shown[i], xerr=xerr, yerr=yerr,
                        fmt="^" if outside else "o", ms=9 if front[i] else 6, color=colors[row["method"]], ecolor="0.6",
                        elinewidth=1, capsize=2, mec="black" if front[i] else colors[row["method"]],
                        mew=1.5 if front[i] else 0.5, zorder=3, label=row["method"], clip_on=not outside)
            if outside:
                clipped.append(f"{row['method']} (accuracy {row['accuracy']:.3f}, {metric.upper()} {row[metric]:.3f})")
        _label_points(ax, x_shown, y_shown, list(rows["method"]), front)
        if clipped:
            ax.text(0.0, -0.16, "axes clipped; ▲ on the edge: " + "; ".join(clipped), transform=ax.transAxes,
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
# Smoothed reliability diagrams, count calibration


def smooth_reliability_panel(ax, prob: np.ndarray, outcome: np.ndarray, title: str = "", small: bool = False) -> float:
    """relplot's smoothed reliability curve E[y | f] at the smooth-ECE bandwidth, the density of f below. -> smECE.

    ``relplot.prepare_rel_diagram`` computes curve, density and smECE (no bootstrap band: it costs
    hundreds of refits); we draw it ourselves because ``relplot.plot_rel_diagram`` restyles
    matplotlib globally.
    """
    diagram = relplot.prepare_rel_diagram(np.clip(prob, CLAMP, 1 - CLAMP), outcome, plot_confidence_band=False,
                                          report_CE_std=False)
    mesh, density = diagram["mesh"], diagram["density"]
    ax.fill_between(mesh, 0, 0.25 * density / density.max(), color="0.8", lw=0, label="density of predictions")
    ax.plot([0, 1], [0, 1], ls="--", color="0.3", lw=1, label="perfect calibration")
    ax.plot(mesh, diagram["mu"], color="#c44e52", lw=1.6 if small else 2.2, label="smoothed E[outcome | prediction]")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    label = f"smECE {diagram['ce']:.3f} (σ {diagram['sigma']:.3f})"
    ax.set_title(f"{title}\n{label}" if title else label, fontsize=8 if small else 10)
    ax.tick_params(labelsize=7 if small else 9)
    return float(diagram["ce"])


def smooth_reliability_figure(predictions: list[Predictions], title: str) -> Figure:
    """Like ``reliability_figure``, with smoothed curves: a panel per task plus all tasks pooled."""
    names = predictions[0].task_names
    suffix = f"{len(predictions)} seeds pooled" if len(predictions) > 1 else "1 run"
    panels = len(names) + 1 if len(names) > 1 else 1
    figure, flat, _ = _panel_grid(panels, row_height=2.1, single_size=(4.6, 4.8))
    if panels == 1:
        prob, outcome, _, binary = _pool(predictions, None)
        smooth_reliability_panel(flat[0], prob, outcome, f"{title}: {names[0]} ({suffix})")
    else:
        binary = _task_panels(flat, predictions, lambda ax, prob, outcome, truth, name, pooled:
                              smooth_reliability_panel(ax, prob, outcome, name, small=True))
    _grid_labels_and_legend(figure, flat, binary, f"Smoothed reliability: {title} ({suffix}, test set)")
    figure.tight_layout(rect=(0.02, 0.02, 1, 0.94 if panels == 1 else 0.965))
    return figure


def count_calibration_figure(predictions: list[Predictions], title: str) -> Figure | None:
    """Expected number of positive attributes Σ_t p_t per image against the actual count (binary tasks).

    Top: mean actual count per integer bin of the expected count (and the mean true expected count
    Σ_t p*_t where known); bottom: images per bin. None with fewer than two binary tasks.
    """
    binary = [t for t, z in enumerate(predictions[0].logits) if np.ndim(z) == 1]
    if len(binary) < 2:
        return None
    probs = np.concatenate([expit(np.stack([p.logits[t] for t in binary]).astype(np.float64)) for p in predictions], 1)
    labels = np.concatenate([np.stack([p.labels[t] for t in binary]) for p in predictions], 1).astype(np.float64)
    curve = count_calibration(probs.sum(0), labels.sum(0), len(binary))
    filled = curve.samples > 0
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(5.6, 6.2), sharex=True, height_ratios=(3, 1))
    top.plot([0, len(binary)], [0, len(binary)], ls="--", color="0.3", lw=1, label="perfect count calibration")
    top.plot(curve.mean_expected[filled], curve.mean_actual[filled], "o-", color="#4c72b0", ms=4,
             label=f"mean actual count (count ECE {curve.ece:.3f})")
    if all(p.true_probs is not None for p in predictions):
        truth = np.concatenate([np.stack([p.true_probs[t] for t in binary]) for p in predictions], 1)
        true_curve = count_calibration(probs.sum(0), truth.astype(np.float64).sum(0), len(binary))
        top.plot(true_curve.mean_expected[filled], true_curve.mean_actual[filled], "s", color="black", ms=3,
                 label=f"mean true expected count Σp* (noise-free {true_curve.ece:.3f})")
    span = curve.mean_expected[filled]
    low, high = max(0.0, span.min() - 1), min(float(len(binary)), span.max() + 1)
    top.set_xlim(low, high)
    top.set_ylim(low, high)
    top.set_ylabel("actual number of positive attributes")
    top.legend(fontsize=8, loc="upper left")
    top.grid(alpha=0.3)
    top.set_title(f"Count calibration: {title} ({len(binary)} binary tasks, test set)", fontsize=10)
    bottom.bar(curve.bins[filled], curve.samples[filled], width=0.8, color="0.6")
    bottom.set_xlabel("expected number of positive attributes Σ_t p_t (bins of width 1)")
    bottom.set_ylabel("images")
    figure.tight_layout()
    return figure


# ---------------------------------------------------------------------------------------------
# Calibration drift over training


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


# ---------------------------------------------------------------------------------------------
# The learned calibrator, and the worst-calibrated tasks



def calibrator_figure(trajectories: pd.DataFrame, dataset: str,
                      identity_flags: dict[str, bool] | None = None) -> Figure:
    """Per calibrator parameter (a row): the last epoch's value per task, and the values over epochs.

    ``trajectories``: columns method, seed, epoch, parameter, task, value (mtl_cog.reporting.trajectories).
    Left: tasks sorted by the value, mean over seeds with their range. Right: median over tasks per
    epoch, the band spanning all tasks. The dashed line is the identity; a method whose calibrator
    never left it is marked "(at identity)" in the legend.
    """
    parameters = list(dict.fromkeys(trajectories["parameter"]))
    methods = sorted(set(trajectories["method"]))
    colors = method_colors(methods)
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
                            fmt="o-", ms=3, lw=1, capsize=1.5, color=colors[method], label=label)
            by_epoch = mine.groupby("epoch")["value"]
            epochs = np.array(sorted(mine["epoch"].unique()))
            over.plot(epochs, by_epoch.median().loc[epochs], color=colors[method], lw=1.5, label=label)
            over.fill_between(epochs, by_epoch.min().loc[epochs], by_epoch.max().loc[epochs], color=colors[method],
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


def worst_tasks_figure(per_task: pd.DataFrame, dataset: str, metric: str = "ece@15", k: int = 10) -> Figure:
    """One panel per method: its ``k`` worst-calibrated tasks by ``metric``, sorted, worst on top."""
    rows = per_task[per_task["dataset"] == dataset]
    methods = list(dict.fromkeys(rows["method"]))
    colors = method_colors(methods)
    cols = min(3, len(methods))
    nrows = int(np.ceil(len(methods) / cols))
    figure, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 0.28 * k * nrows + 1.2 * nrows + 0.6),
                                sharex=True, squeeze=False)
    for ax, method in zip(axes.reshape(-1), methods):
        mine = rows[rows["method"] == method].sort_values(metric, ascending=False).head(k)
        y = np.arange(len(mine))[::-1]
        std = mine[f"{metric}_std"] if f"{metric}_std" in mine else None
        ax.barh(y, mine[metric], xerr=None if std is None else std.fillna(0), color=colors[method],
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
