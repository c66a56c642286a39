"""Reliability diagrams of prediction files: binned (Guo et al., 2017), smoothed, and count calibration.

A figure pools one method's prediction files (seeds): a panel per task and one for all tasks
pooled (each task contributes its N predictions, so the pool weighs tasks equally, like the
unweighted task mean); where p* is known, the bin's mean true probability is drawn too. The
smoothed diagram is relplot's kernel regression at the smooth-ECE bandwidth (the diagram that goes
with ``smece``); count calibration sets the expected number of positive attributes per image
against the actual one (``mtl_cog.evaluation.multitask_metrics``). Used for one run
(``run_report``) and, pooled over seeds, by ``compare``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import relplot
from matplotlib.figure import Figure
from scipy.special import expit

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.binning import CLAMP, calibration_inputs, reliability_bins
from mtl_cog.evaluation.multitask_metrics import count_calibration
from mtl_cog.evaluation.predictions import Predictions, labelled_only


def pool_task(predictions: list[Predictions],
              task: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, bool]:
    """Concatenate a task (or every task, ``task=None``) over the seeds' prediction files; each task's
    labelled rows only (partly labelled data)."""
    parts = []
    for pred in map(labelled_only, predictions):
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
    stats = reliability_bins(prob, outcome, n_bins, truth)  # the bins of ece@B (mtl_cog.evaluation.binning)
    count, mean_p, freq = stats["count"], stats["mean_confidence"], stats["frequency"]
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
        ax.plot(mean_p[filled], stats["mean_truth"][filled], "o", ms=2.5 if small else 4, color="black",
                label="mean true probability p*")
    ece = stats["ece"]
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
    prob, outcome, truth, binary = pool_task(predictions, None)
    draw(flat[0], prob, outcome, truth, "ALL TASKS POOLED", True)
    flat[0].title.set_fontweight("bold")
    for t, name in enumerate(predictions[0].task_names):
        prob, outcome, truth, _ = pool_task(predictions, t)
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
        prob, outcome, truth, binary = pool_task(predictions, 0)
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
        prob, outcome, truth, binary = pool_task(pooled[method], None)
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
        prob, outcome, _, binary = pool_task(predictions, None)
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
    Σ_t p*_t where known); bottom: images per bin. None with fewer than two binary tasks. Partly labelled
    data: the images labelled in every task (a count needs all of them); None with fewer than two.
    """
    predictions = [labelled_only(p, every_task=True) for p in predictions]
    if sum(len(p) for p in predictions) < 2:
        return None
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
