"""End-of-training report of one run: into the run folder always, and to W&B when it is tracking.

Per-epoch numbers already reach W&B with keys ``<task>/<split>/<metric>`` (mtl_cog.runs.tracking),
which W&B groups into one workspace section per attribute plus ``mean/``. At the end of training
this module adds what a per-epoch scalar cannot show:

- ``reliability_test.png`` in the run folder: the reliability diagram of the best checkpoint on
  the test set (a panel per task plus all tasks pooled; mtl_cog/reporting/plots/reliability.py);
- ``smooth_reliability_test.png``: the same panels as smoothed reliability curves (the diagram of
  ``smece``), and ``count_calibration_test.png`` with two or more binary tasks: the expected
  against the actual number of positive attributes per image;
- ``risk_coverage_test.png``: selective prediction, risk against coverage (mean over tasks), whose
  area is ``aurc``;
- ``test_truth_metrics.csv`` in the run folder when the data set knows p* (mtl_cog.evaluation.truth);
- on W&B (through the Accelerate tracker, main process only): ``test/per_task_metrics`` as a
  ``wandb.Table`` (one row per task + mean, every metric, truth metrics where known) and
  ``test/reliability``, ``test/smooth_reliability``, ``test/count_calibration`` as ``wandb.Image``.

Nothing here can stop a finished training run: a W&B failure becomes a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from accelerate import Accelerator

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.metrics import metrics_frame
from mtl_cog.evaluation.predictions import Predictions, load_predictions
from mtl_cog.evaluation.truth import labelled_truth_metrics
from mtl_cog.io import atomic_write
from mtl_cog.reporting import plots
from mtl_cog.reporting.shift_report import risk_coverage_figure
from mtl_cog.runs import rundir


def write_report_files(run_dir: Path, predictions: Predictions, table: pd.DataFrame,
                       n_bins: int = SUMMARY_BINS) -> tuple[pd.DataFrame, Path, dict[str, Path]]:
    """Reliability PNGs (and truth metrics where known) into the run folder -> (per-task table, PNG, other PNGs).

    ``predictions`` and ``table`` are the test predictions and their ``metrics_frame`` as the run holds
    them in memory (``mtl_cog.reporting.end_of_run``); nothing is read back from the files just written.
    """
    # partly labelled data: each figure takes its labelled rows itself (a task's own, or those labelled in
    # every task for the count calibration); the truth metrics the rows labelled in every task (docs/guides/mtl.md)
    bins = sorted({int(c.split("@")[1]) for c in table.columns if c.startswith("ece@")} | {n_bins})
    scores = labelled_truth_metrics(predictions, bins)
    if scores is not None:
        truth = metrics_frame(scores)
        atomic_write(run_dir / rundir.TRUTH_METRICS, lambda tmp: truth.to_csv(tmp, index=False))
        table = table.merge(truth, on="task", how="left")
    figure = plots.reliability_figure([predictions], run_dir.name, n_bins)
    png = plots.save_figure(figure, run_dir / rundir.RELIABILITY_PNG)
    extra = {"smooth_reliability": plots.save_figure(plots.smooth_reliability_figure([predictions], run_dir.name),
                                                     run_dir / rundir.SMOOTH_RELIABILITY_PNG)}
    extra["risk_coverage"] = plots.save_figure(risk_coverage_figure({run_dir.name: predictions}, "test split"),
                                               run_dir / rundir.RISK_COVERAGE_PNG)
    counts = plots.count_calibration_figure([predictions], run_dir.name)
    if counts is not None:
        extra["count_calibration"] = plots.save_figure(counts, run_dir / rundir.COUNT_CALIBRATION_PNG)
    return table, png, extra


def wandb_payload(table: pd.DataFrame, png: Path, extra: dict[str, Path] | None = None) -> dict:
    import wandb

    payload = {"test/per_task_metrics": wandb.Table(dataframe=table), "test/reliability": wandb.Image(str(png))}
    payload.update({f"test/{name}": wandb.Image(str(path)) for name, path in (extra or {}).items()})
    return payload


@dataclass
class RunReport:
    table: pd.DataFrame  # one row per task + mean, every metric (truth metrics where known)
    png: Path  # the reliability diagram
    extra: dict[str, Path] = field(default_factory=dict)  # smoothed reliability, count calibration


def write_run_report(run_dir: Path, predictions: Predictions | None = None, table: pd.DataFrame | None = None,
                     n_bins: int = SUMMARY_BINS) -> RunReport | None:
    """``write_report_files``, with any failure a warning: a finished run must not fail on a figure.

    Without ``predictions`` and ``table`` (the report of a run folder written earlier), they are read
    from its ``predictions_test.npz`` and ``test_metrics.csv``; at the end of a run they come from memory.
    """
    try:
        run_dir = Path(run_dir)
        if predictions is None:
            predictions = load_predictions(run_dir / rundir.predictions_file("test"))
        if table is None:
            table = pd.read_csv(run_dir / rundir.TEST_METRICS)
        return RunReport(*write_report_files(run_dir, predictions, table, n_bins))
    except Exception as err:  # noqa: BLE001  (the run is finished and saved; a figure must not fail it)
        warnings.warn(f"could not write the end-of-training report into {run_dir}: {err!r}", stacklevel=2)
        return None


def publish_final_report(accelerator: Accelerator, report: RunReport | None, tracking_enabled: bool) -> None:
    """The report's table and figure to W&B (main process, when tracking); call before ``end_training``."""
    if report is None or not accelerator.is_main_process:
        return
    if not tracking_enabled or "wandb" not in {t.name for t in accelerator.trackers}:
        return
    try:
        accelerator.get_tracker("wandb", unwrap=True).log(wandb_payload(report.table, report.png, report.extra))
    except Exception as err:  # noqa: BLE001  (network, auth, service errors: never fatal)
        warnings.warn(f"W&B could not take the final report ({err}); it is in the run folder.", stacklevel=2)
