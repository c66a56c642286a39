"""Compare methods across run folders: the paper's tables and figures in one command.

    python scripts/compare.py RUN_DIR_OR_PARENT [...] --out REPORT_DIR [--bins 5 10 15 20 50] [--summary-bins 15]

Runs are grouped by data set and method (post-hoc calibrators fitted on a run appear as
``<method>+<posthoc>``) and averaged over seeds. REPORT_DIR receives:

  summary.csv, summary.md      per data set, one row per method: accuracy, NLL, Brier, ECE/RMSCE/MCE
                               (mean ± std over seeds), average rank over accuracy/NLL/Brier, top-ranked
  calibration_errors.csv       every calibration error at every bin count, with the rank per bin count
  per_task.csv                 multi-task data sets: every metric of every task and method
  truth.csv                    where the data set knows p* (synthetic): noise-free calibration errors,
                               mean |p̂ − p*|, KL, Bayes floors (see mtl_cog/truth.py)
  reliability_<ds>_<method>.png, reliability_<ds>.png, pareto_<ds>.png, calibration_vs_bins_<ds>.png,
  ece_per_task_<ds>.png (multi-task), truth_<ds>.png (where p* is known)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mtl_cog.config.schema import check_bins
from mtl_cog.constants import DEFAULT_BINS, SUMMARY_BINS
from mtl_cog.errors import run_cli
from mtl_cog.evaluation.truth import FLOOR_METRICS, MODEL_METRICS
from mtl_cog.io import atomic_write, atomic_write_text, check_writable, make_folder
from mtl_cog.reporting import plots
from mtl_cog.reporting.tables import (
    calibration_error_table,
    load_runs,
    per_task_table,
    pooled_predictions,
    score_runs,
    summary_markdown,
    summary_table,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or folders that hold run folders")
    parser.add_argument("--out", type=Path, required=True, help="report folder (created)")
    parser.add_argument("--bins", type=int, nargs="+", default=list(DEFAULT_BINS),
                        help="bin counts of calibration errors")
    parser.add_argument("--summary-bins", type=int, default=SUMMARY_BINS,
                        help="bin count shown in summary.md and the figures")
    return parser.parse_args(argv)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)


def _write_csv(frame, path: Path) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_figures(records, summary, errors, per_task, out: Path, bins: int) -> list[Path]:
    written = []
    pooled = pooled_predictions(records)
    for dataset in dict.fromkeys(summary["dataset"]):
        methods = {m: pooled[(d, m)] for (d, m) in pooled if d == dataset}
        for method, predictions in methods.items():
            figure = plots.reliability_figure(predictions, f"{dataset} / {method}", bins)
            written.append(plots.save_figure(figure, out / f"reliability_{_slug(dataset)}_{_slug(method)}.png"))
        if methods:
            figure = plots.reliability_comparison_figure(methods, dataset, bins)
            written.append(plots.save_figure(figure, out / f"reliability_{_slug(dataset)}.png"))
        written.append(plots.save_figure(plots.pareto_figure(summary, dataset), out / f"pareto_{_slug(dataset)}.png"))
        written.append(plots.save_figure(plots.bins_figure(errors, dataset),
                                         out / f"calibration_vs_bins_{_slug(dataset)}.png"))
        if dataset in set(per_task["dataset"]) and f"ece@{bins}" in per_task:
            written.append(plots.save_figure(plots.per_task_ece_figure(per_task, dataset, f"ece@{bins}"),
                                             out / f"ece_per_task_{_slug(dataset)}.png"))
        rows = summary[summary["dataset"] == dataset]
        if f"nf_ece@{bins}" in rows and rows[f"nf_ece@{bins}"].notna().any():
            written.append(plots.save_figure(plots.truth_figure(summary, dataset, bins),
                                             out / f"truth_{_slug(dataset)}.png"))
    return written


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    check_bins(args.bins, "--bins")
    check_bins([args.summary_bins], "--summary-bins")
    check_writable(args.out, "--out", folder=True)  # before the work, not after it
    bins = sorted(set(args.bins) | {args.summary_bins})
    records = load_runs(args.runs)
    print(f"{len(records)} run(s): " + ", ".join(sorted({f'{r.dataset}/{r.method}' for r in records})))
    scores = score_runs(records, bins)
    summary = summary_table(scores)
    errors = calibration_error_table(scores)
    per_task = per_task_table(scores)
    out = make_folder(args.out)
    _write_csv(summary, out / "summary.csv")
    _write_csv(errors, out / "calibration_errors.csv")
    _write_csv(per_task, out / "per_task.csv")
    truth_columns = [c for c in summary.columns if c.startswith("nf_") or c.split("_std")[0] in
                     (*MODEL_METRICS, *FLOOR_METRICS)]
    truth_rows = summary[summary[truth_columns].notna().any(axis=1)] if truth_columns else summary.iloc[:0]
    if not truth_rows.empty:
        _write_csv(truth_rows[["dataset", "method", "n_seeds", *truth_columns]], out / "truth.csv")
    atomic_write_text(out / "summary.md", summary_markdown(summary, args.summary_bins, args.summary_bins))
    figures = write_figures(records, summary, errors, per_task, out, args.summary_bins)
    print(summary_markdown(summary, args.summary_bins, args.summary_bins))
    print(f"{len(figures)} figure(s) written")
    print(str(out))
    return out


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
