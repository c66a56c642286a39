"""The end of a run, written once: assess (predict -> score -> add-ons) -> save -> report, from memory.

``fit`` calls ``finish_run`` with its selected network; ``evaluate --run`` and ``list-front`` run the
same first half (``mtl_cog.evaluation.assess``: ``assess_split`` from a network, ``assess`` from saved
predictions), so a re-evaluated number is computed exactly as the run computed it. The report
(figures, truth metrics, the W&B table) is made from the predictions and the metrics in memory,
never read back from the files this module has just written.

Evaluation add-ons (subgroup metrics, certified accuracy) do not plug in here but one step
earlier, in ``mtl_cog.evaluation.assess.ADD_ONS``: what they add to a split's metrics reaches
``test_metrics.csv``, the console table, ``metrics.jsonl``'s final line, the W&B summary and
``evaluate``'s JSON without a change to this file. Calibration under corruption shift is not an
add-on (it scores other splits into a table of its own): it is ``finish_run``'s ``shift`` job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from accelerate import Accelerator
from torch import nn

from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.evaluation.assess import AssessSettings, SplitAssessment, assess_split
from mtl_cog.evaluation.metrics import format_table, metrics_frame
from mtl_cog.evaluation.predictions import as_stored, save_predictions
from mtl_cog.evaluation.shift import shift_summary_scalars
from mtl_cog.io import atomic_write, atomic_write_text
from mtl_cog.reporting.run_report import publish_final_report, write_run_report
from mtl_cog.reporting.shift_report import write_group_files, write_shift_files
from mtl_cog.reporting.tables import worst_tasks_line
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import record_digests
from mtl_cog.runs.metrics_log import final_record
from mtl_cog.runs.tracking import Tracker


def assess_and_save(accelerator: Accelerator, network: nn.Module, spec: TaskSpec, splits: dict[str, SplitData],
                    batch_size: int, settings: AssessSettings, run_dir: Path) -> dict[str, SplitAssessment]:
    """Each split assessed (every process), its predictions saved into the run folder (main process)."""
    assessed = {}
    for name, split in splits.items():
        assessed[name] = assess_split(accelerator, network, spec, split, batch_size, settings)
        if accelerator.is_main_process:
            save_predictions(run_dir / rundir.predictions_file(name), assessed[name].predictions)
    return assessed


def finish_run(accelerator: Accelerator, network: nn.Module, spec: TaskSpec, val: SplitData, test: SplitData,
               batch_size: int, settings: AssessSettings, run_dir: Path, tracker: Tracker, best_epoch: int,
               final_epoch: int, calibrator_at_identity: bool, selected: str,
               shift: Callable[[dict[str, SplitAssessment]], pd.DataFrame] | None = None) -> dict[str, dict]:
    """Assess and save validation and test, log the final numbers, write ``test_metrics.csv`` and the
    report, mark the run ``DONE``, print the test table; return {split: metrics}.

    The report comes before ``DONE``, so a ``DONE`` run has it; ``final_epoch`` is the epoch number
    of ``metrics.jsonl``'s final line (one past the last epoch). ``shift`` (eval.shift: every process)
    scores the test split under corruptions from the assessed splits; its table is written before
    ``DONE`` (``shift_metrics.csv``, ``shift_test.png``), its summary goes to W&B. The subgroup cells
    of eval.groups go to ``group_metrics.csv``.
    """
    assessed = assess_and_save(accelerator, network, spec, {"val": val, "test": test}, batch_size, settings, run_dir)
    results = {name: a.metrics for name, a in assessed.items()}
    # The best network's numbers: one value per key, in the W&B run summary (never a one-point
    # chart at an invented step); metrics.jsonl keeps its final line.
    shift_table = shift(assessed) if shift is not None else None
    record, summary = final_record(final_epoch, best_epoch, results, calibrator_at_identity)
    if shift_table is not None:
        summary.update(shift_summary_scalars(shift_table))
    tracker.log_final(record, summary)
    report = None
    if accelerator.is_main_process:
        frame = metrics_frame(results["test"])
        atomic_write(run_dir / rundir.TEST_METRICS, lambda tmp: frame.to_csv(tmp, index=False))
        if "groups" in results["test"]:
            write_group_files(run_dir, results["test"]["groups"])
        if shift_table is not None:
            write_shift_files(run_dir, shift_table)
        report = write_run_report(run_dir, as_stored(assessed["test"].predictions), frame)
        record_digests(run_dir)  # what readers check the run's files against (mtl_cog.runs.digests)
        atomic_write_text(run_dir / rundir.DONE, f"best_epoch={best_epoch}\n")
    publish_final_report(accelerator, report, tracker.enabled)  # the same table and figure to W&B
    tracker.finish()
    accelerator.print(f"\ntest metrics of the best checkpoint ({selected}):")
    accelerator.print(format_table(results["test"]))
    if worst := worst_tasks_line(results["test"]["tasks"], settings.bins):  # multi-task: where to look first
        accelerator.print(worst)
    return results
