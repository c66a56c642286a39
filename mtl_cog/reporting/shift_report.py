"""Files and figures of calibration where users need it: under corruption shift, in subgroups, selective prediction.

- ``write_shift_files``: ``shift_metrics.csv`` and ``shift_test.png``; ``write_group_files``:
  ``group_metrics.csv`` (mtl_cog.evaluation.groups), both into a run folder, atomically;

- ``shift_figure``: accuracy, NLL and ECE@15 (task means, averaged over the corruptions) against
  severity 0 (clean) .. 5, one line per method: the run's post-hoc calibrators in one run folder,
  or every method of a comparison (``compare``), e.g. COG-FC vs baseline+TS under shift;
- ``risk_coverage_figure``: risk (error rate among the answered) against coverage (share
  answered, most confident first) per method, the curve whose area is ``aurc``
  (mtl_cog.evaluation.selective); for several tasks the curves are averaged over tasks at each
  coverage.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation import shift
from mtl_cog.evaluation.groups import cells_frame
from mtl_cog.evaluation.predictions import Predictions, labelled_rows
from mtl_cog.evaluation.selective import risk_coverage, task_confidence_error
from mtl_cog.io import atomic_write
from mtl_cog.reporting.plots import method_colors, save_figure  # (sets matplotlib's Agg backend first)
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import add_digests, verify_digests

SHIFT_PANELS = (("accuracy", "accuracy"), ("nll", "NLL"), (f"ece@{SUMMARY_BINS}", f"ECE@{SUMMARY_BINS}"))


def shift_figure(curves: pd.DataFrame, title: str) -> Figure:
    """``curves``: columns method, severity and the panel metrics (one row per method x severity)."""
    figure, axes = plt.subplots(1, len(SHIFT_PANELS), figsize=(4.2 * len(SHIFT_PANELS), 3.6), squeeze=False)
    colors = method_colors(list(curves.method.unique()))
    for ax, (column, label) in zip(axes[0], SHIFT_PANELS):
        for method, rows in curves.groupby("method", sort=True):
            rows = rows.sort_values("severity")
            ax.plot(rows.severity, rows[column], marker="o", label=method, color=colors[method])
        ax.set_xlabel("severity (0 = clean)")
        ax.set_ylabel(f"{label} (mean over tasks and corruptions)")
        ax.set_xticks(sorted(curves.severity.unique()))
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def mean_risk_coverage(predictions: Predictions, points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Risk at ``points`` coverages in (0, 1], averaged over tasks (each task's curve interpolated there),
    each task on its labelled rows (partly labelled data)."""
    grid = np.linspace(1 / points, 1, points)
    curves = []
    for logits, labels in zip(predictions.logits, predictions.labels):
        coverage, risk = risk_coverage(*task_confidence_error(*labelled_rows(logits, labels)))
        curves.append(np.interp(grid, coverage, risk))
    return grid, np.mean(curves, axis=0)


def risk_coverage_figure(by_method: dict[str, Predictions], title: str) -> Figure:
    """One curve per method (task mean); the legend gives each method's mean AURC over tasks."""
    figure, ax = plt.subplots(figsize=(5.2, 4.0))
    colors = method_colors(list(by_method))
    for method, predictions in by_method.items():
        coverage, risk = mean_risk_coverage(predictions)
        ax.plot(coverage, risk, label=method, color=colors[method])
    ax.set_xlabel("coverage (share of samples answered, most confident first)")
    ax.set_ylabel("risk (error rate among those answered)")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    figure.tight_layout()
    return figure


def write_shift_files(run_dir: Path, frame: pd.DataFrame) -> tuple[Path, Path]:
    """``shift_metrics.csv`` (every row) and ``shift_test.png`` (the summary curves) into ``run_dir``."""
    csv = Path(run_dir) / rundir.SHIFT_METRICS
    atomic_write(csv, lambda tmp: frame.to_csv(tmp, index=False))
    add_digests(run_dir, [rundir.SHIFT_METRICS])  # into a finished run's record (its readers check it)
    suites = ", ".join(sorted(frame.suite.unique())) if "suite" in frame else "imagenetc"
    png = save_figure(shift_figure(shift.summary(frame),
                                   f"{Path(run_dir).name}: test split under corruptions ({suites} severities)"),
                      Path(run_dir) / rundir.SHIFT_PNG)
    return csv, png


def write_group_files(run_dir: Path, report: dict) -> Path:
    path = Path(run_dir) / rundir.GROUP_METRICS
    frame = cells_frame(report)
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
    add_digests(run_dir, [rundir.GROUP_METRICS])
    return path


# ---------------------------------------------------------------------------------------------
# Across runs (``compare``)


def method_shift_table(records) -> pd.DataFrame:
    """Every run's ``shift_metrics.csv`` summary rows, named like ``compare``'s methods: the run's
    method, ``<method>+<posthoc>`` for a post-hoc calibrator -> columns dataset, method, seed, severity, metrics."""
    frames = []
    for record in records:
        path = Path(record.run_dir) / rundir.SHIFT_METRICS
        if not path.is_file():
            continue
        verify_digests(record.run_dir, [rundir.SHIFT_METRICS])
        rows = pd.read_csv(path)
        # runs scored under different severity suites are never averaged together: the suite names the data set
        suite = ", ".join(sorted(rows.suite.unique())) if "suite" in rows else "imagenetc"
        curves = shift.summary(rows, ("accuracy", "nll", "brier", f"ece@{SUMMARY_BINS}", "smece", "aurc"))
        curves["method"] = [record.method if m == "none" else f"{record.method}+{m}" for m in curves.method]
        frames.append(curves.assign(dataset=f"{record.dataset} ({suite})", seed=record.seed))
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    return table[["dataset", "method", "seed", *[c for c in table.columns if c not in ("dataset", "method", "seed")]]]


def write_compare_files(records, pooled: dict, out: Path, slug) -> list[Path]:
    """``shift.csv`` + ``shift_<ds>.png`` (runs with shift_metrics.csv; mean over seeds, one line per method)
    and ``risk_coverage_<ds>.png`` (every method's test predictions, seeds pooled)."""
    written = []
    table = method_shift_table(records)
    if not table.empty:
        csv = Path(out) / "shift.csv"
        atomic_write(csv, lambda tmp: table.to_csv(tmp, index=False))
        written.append(csv)
        for dataset, rows in table.groupby("dataset", sort=False):
            curves = rows.drop(columns=["dataset", "seed"]).groupby(["method", "severity"]).mean().reset_index()
            written.append(save_figure(shift_figure(curves, f"{dataset}: test split under corruptions"),
                                       Path(out) / f"shift_{slug(dataset)}.png"))
    for dataset in dict.fromkeys(d for d, _ in pooled):
        by_method = {m: _concat_seeds(parts) for (d, m), parts in pooled.items() if d == dataset}
        written.append(save_figure(risk_coverage_figure(by_method, f"{dataset}: selective prediction"),
                                   Path(out) / f"risk_coverage_{slug(dataset)}.png"))
    return written


def _concat_seeds(parts: list[Predictions]) -> Predictions:
    """Several seeds' predictions as one set (the curve of a method over all its runs)."""
    return Predictions(list(parts[0].task_names),
                       [np.concatenate([p.logits[t] for p in parts]) for t in range(len(parts[0].task_names))],
                       [np.concatenate([p.labels[t] for p in parts]) for t in range(len(parts[0].task_names))])
