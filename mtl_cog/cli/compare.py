"""Compare methods across run folders: the paper's tables and figures in one command.

    python scripts/compare.py RUN_DIR_OR_PARENT [...] --out REPORT_DIR [--bins 5 10 15 20 50] [--summary-bins 15]

Runs are grouped by data set and method (post-hoc calibrators fitted on a run appear as
``<method>+<posthoc>``) and averaged over seeds. Only runs of the same protocol (data options,
epochs, backbone, image size) are ranked together: others are ranked separately as
``<dataset>[key=value]`` and summary.md says which runs were set apart and why. "±" appears only
with at least two distinct seeds; the seed count is of distinct seeds. REPORT_DIR receives:

  summary.csv, summary.md      per data set, one row per method: accuracy, NLL, Brier, ECE/RMSCE/MCE
                               (mean ± std over seeds), average rank over accuracy/NLL/Brier, top-ranked;
                               summary.md also: set-apart runs, paired COG-vs-counterpart differences,
                               rank spread over seeds, learned calibrators, convergence
  summary.tex                  summary.md's tables in LaTeX (booktabs)
  paired_differences.csv       each COG variant minus its counterpart (method.counterpart): mean
                               difference in NLL, Brier, ECE@15, accuracy, 95% t interval over
                               seeds (task-averaged; mtl_cog/analysis/paired.py)
  rank_spread.csv              each method's average rank per seed: mean, std, range
  calibrator.csv               learned per-task calibrator values (first/last epoch) from metrics.jsonl,
                               and whether the calibrator never left the identity
  convergence.csv              per run: did the validation NLL and the calibrator settle?
  task_weights.csv             runs under a multi-task aggregator (mtl.aggregator): each task's weight of
                               the backbone's gradient at the first and last epoch (docs/guides/mtl.md)
  calibration_errors.csv       every calibration error at every bin count, with the rank per bin count
  per_task.csv                 multi-task data sets: every metric of every task and method
  truth.csv                    where the data set knows p* (synthetic): noise-free calibration errors,
                               mean |p̂ − p*|, KL, Bayes floors (see mtl_cog/evaluation/truth.py)
  reliability_<ds>_<method>.png, reliability_<ds>.png, pareto_<ds>.png, calibration_vs_bins_<ds>.png,
  ece_per_task_<ds>.png and worst_tasks_<ds>.png (multi-task), truth_<ds>.png (where p* is known),
  calibrator_<ds>.png (methods with a learned calibrator: values across tasks and over epochs),
  risk_coverage_<ds>.png       selective prediction: risk against coverage, one curve per method
  shift.csv, shift_<ds>.png    runs with shift_metrics.csv (eval.shift / evaluate --shift): accuracy,
                               NLL, ECE@15 against severity, one line per method (post-hoc: <method>+ts)
  report.html                  all of it in one page that opens offline: sortable summary, paired verdicts,
                               convergence, calibrators, a task picker with every method's reliability
                               diagram side by side, subgroups and shift (mtl_cog/reporting/html_report.py)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.config.arguments import Parser, whole_number
from mtl_cog.config.schema import MAX_BINS, check_bins
from mtl_cog.constants import DEFAULT_BINS, SUMMARY_BINS
from mtl_cog.errors import run_cli
from mtl_cog.io import check_writable
from mtl_cog.reporting.comparison import write_comparison


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or folders that hold run folders")
    parser.add_argument("--out", type=Path, required=True, help="report folder (created)")
    parser.add_argument("--bins", type=whole_number(1, MAX_BINS, "a bin count"), nargs="+",
                        default=list(DEFAULT_BINS),
                        help="bin counts of calibration errors")
    parser.add_argument("--summary-bins", type=whole_number(1, MAX_BINS, "a bin count"), default=SUMMARY_BINS,
                        help="bin count shown in summary.md and the figures")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    check_bins(args.bins, "--bins")
    check_bins([args.summary_bins], "--summary-bins")
    check_writable(args.out, "--out", folder=True)  # before the work, not after it
    return write_comparison(args.runs, args.out, args.bins, args.summary_bins)


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
