"""The HTML report's tables from run folders: reliability bins per task and method, subgroup cells.

``compare`` scores runs into the comparison tables (``mtl_cog.reporting.tables``); what the HTML page
needs beyond them is read here: the bins of each method's reliability diagram on each task (seeds
pooled, ``evaluation.binning.reliability_bins``: the bins of ``ece@B``) and the runs' subgroup cells
(``group_metrics.csv``). ``report_tables`` puts everything into ``html_report.ReportTables``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.evaluation.binning import reliability_bins
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.reporting.html_report import ALL_TASKS, ReportTables
from mtl_cog.reporting.plots.reliability import pool_task
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import verify_digests

BIN_COLUMNS = ["dataset", "method", "task", "bin", "n_bins", "count", "mean_confidence", "frequency", "mean_truth"]


def reliability_table(pooled: dict[tuple[str, str], list[Predictions]], n_bins: int) -> pd.DataFrame:
    """One row per (data set, method, task, bin), seeds pooled; task ``ALL_TASKS`` pools every task (multi-task)."""
    frames = []
    for (dataset, method), predictions in pooled.items():
        names = list(predictions[0].task_names)
        tasks = [(ALL_TASKS, None)] if len(names) > 1 else []
        for task, index in [*tasks, *((name, t) for t, name in enumerate(names))]:
            prob, outcome, truth, _ = pool_task(predictions, index)
            stats = reliability_bins(prob, outcome, n_bins, truth)
            frames.append(pd.DataFrame({"dataset": dataset, "method": method, "task": task, "bin": np.arange(n_bins),
                                        "n_bins": n_bins, **{k: stats[k] for k in BIN_COLUMNS[5:]}}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=BIN_COLUMNS)


def subgroup_table(records) -> pd.DataFrame:
    """Every run's ``group_metrics.csv`` (``eval.groups``), with its data set, method and seed."""
    present = [r for r in records if (Path(r.run_dir) / rundir.GROUP_METRICS).is_file()]
    for r in present:
        verify_digests(r.run_dir, [rundir.GROUP_METRICS])  # the file its run wrote (digests.json)
    frames = [pd.read_csv(Path(r.run_dir) / rundir.GROUP_METRICS).assign(dataset=r.dataset, method=r.method,
                                                                         seed=r.seed) for r in present]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def report_tables(records, pooled, *, summary: pd.DataFrame, paired: pd.DataFrame, per_task: pd.DataFrame,
                  calibrators: pd.DataFrame, convergence: pd.DataFrame, curves: pd.DataFrame, shift: pd.DataFrame,
                  notes: list[str], bins: int) -> ReportTables:
    """The comparison's tables plus the per-task reliability bins and subgroup cells, as the report's input."""
    runs = len(records)
    return ReportTables(summary=summary, paired=paired, per_task=per_task, reliability=reliability_table(pooled, bins),
                        curves=curves, convergence=convergence, calibrators=calibrators, shift=shift,
                        subgroups=subgroup_table(records), notes=notes, bins=bins,
                        subtitle=f"{runs} run{'s' if runs != 1 else ''}, test set; written by mtl-cog compare")
