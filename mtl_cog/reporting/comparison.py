"""The comparison report across run folders: tables, paired differences, figures (``compare``'s output).

``write_comparison`` is what ``compare`` runs and what ``reproduce`` ends with, so no command calls
another; the files it writes are listed in ``mtl_cog/cli/compare.py``'s docstring.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from mtl_cog.analysis.paired import counterpart_pairs, paired_differences, rank_spread
from mtl_cog.bundles.run_records import load_runs, pooled_predictions
from mtl_cog.bundles.trajectories import (
    calibrator_table,
    calibrator_trajectory,
    convergence_table,
    epoch_curve_table,
    task_weight_table,
)
from mtl_cog.evaluation.truth import FLOOR_METRICS, MODEL_METRICS
from mtl_cog.io import atomic_write, atomic_write_text, output_folder
from mtl_cog.progress import Progress
from mtl_cog.reporting import plots, shift_report
from mtl_cog.reporting.html_inputs import report_tables
from mtl_cog.reporting.html_report import write_html_report
from mtl_cog.reporting.latex import summary_latex
from mtl_cog.reporting.tables import (
    calibration_error_table,
    per_task_table,
    score_runs,
    summary_markdown,
    summary_table,
)

WORST_K = 10  # tasks shown in worst_tasks_<ds>.png


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)


def _write_csv(frame, path: Path) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_figures(records, pooled: dict, summary, errors, per_task, out: Path, bins: int, trajectories: dict,
                  calibrators: pd.DataFrame) -> list[Path]:
    written = []
    datasets = list(dict.fromkeys(summary["dataset"]))
    progress = Progress(len(datasets), "compare: figures, data set", every=1)
    for dataset in datasets:
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
            written.append(plots.save_figure(plots.worst_tasks_figure(per_task, dataset, f"ece@{bins}", WORST_K),
                                             out / f"worst_tasks_{_slug(dataset)}.png"))
        written += write_calibrator_figure(records, dataset, out, trajectories, calibrators)
        rows = summary[summary["dataset"] == dataset]
        if f"nf_ece@{bins}" in rows and rows[f"nf_ece@{bins}"].notna().any():
            written.append(plots.save_figure(plots.truth_figure(summary, dataset, bins),
                                             out / f"truth_{_slug(dataset)}.png"))
        progress.update(note=dataset)
    progress.close()
    return written + shift_report.write_compare_files(records, pooled, out, _slug)  # shift, risk-coverage


def write_calibrator_figure(records, dataset: str, out: Path, trajectories: dict,
                            calibrators: pd.DataFrame) -> list[Path]:
    """calibrator_<ds>.png from the runs' calibrator trajectories (methods without a learned calibrator have none)."""
    frames = []
    for record in (r for r in records if r.dataset == dataset):
        trajectory = trajectories[record.run_dir]
        if not trajectory.empty:
            frames.append(trajectory.assign(method=record.method, seed=record.seed))
    if not frames:
        return []
    table = calibrators[calibrators["dataset"] == dataset]
    flags = table.groupby("method")["calibrator_at_identity"].agg(lambda s: bool(s.fillna(False).all())).to_dict()
    figure = plots.calibrator_figure(pd.concat(frames, ignore_index=True), dataset, flags)
    return [plots.save_figure(figure, out / f"calibrator_{_slug(dataset)}.png")]


def extra_sections(notes: list[str], paired: pd.DataFrame, spread: pd.DataFrame, calibrators: pd.DataFrame,
                   converge: pd.DataFrame) -> list[str]:
    """summary.md after the tables: what was set apart, the paired differences, rank spread, calibrators."""
    lines = []
    if notes:
        lines += ["## Runs set apart", "", "Runs of another protocol are never ranked with these:", ""]
        lines += [f"- {note}" for note in notes] + [""]
    if not paired.empty:
        lines += ["## COG variants against their counterparts (paired)", "",
                  "Mean difference variant − counterpart over seeds × tasks, 95% t interval over seeds of the "
                  "task-averaged differences (mtl_cog/analysis/paired.py); *better*: the side the interval "
                  "excludes zero for, *inconclusive* when it contains zero or a single seed gives no interval.", "",
                  "| data set | variant | counterpart | metric | difference [95% interval] | seeds × tasks | better |",
                  "|---|---|---|---|---|---|---|"]
        for row in paired.itertuples():
            interval = "(one seed: no interval)" if pd.isna(row.ci_low) else \
                f"[{row.ci_low:+.4f}, {row.ci_high:+.4f}]"
            lines.append(f"| {row.dataset} | {row.variant} | {row.counterpart} | {row.metric} | "
                         f"{row.mean_difference:+.4f} {interval} | {row.n_seeds} × {row.n_tasks} | {row.better} |")
        lines.append("")
    if not spread.empty and (spread["n_seeds"] > 1).any():
        lines += ["## Average rank per seed", "", "The average rank computed on each seed separately (seeds every "
                  "method of the data set has): mean ± std [min, max].", "",
                  "| data set | method | avg rank | seeds |", "|---|---|---|---|"]
        for row in spread.sort_values(["dataset", "avg_rank_mean"], kind="stable").itertuples():
            std = "" if pd.isna(row.avg_rank_std) else f" ± {row.avg_rank_std:.2f}"
            lines.append(f"| {row.dataset} | {row.method} | {row.avg_rank_mean:.2f}{std} "
                         f"[{row.avg_rank_min:.2f}, {row.avg_rank_max:.2f}] | {row.n_seeds} |")
        lines.append("")
    if not calibrators.empty:
        lines += ["## Learned calibrators", "", "Per-task values at the last epoch (calibrator.csv, "
                  "calibrator_<ds>.png: across tasks and over epochs).", "",
                  "| data set | method | parameter | median [min, max] over tasks and seeds | left the identity |",
                  "|---|---|---|---|---|"]
        for (dataset, method, parameter), group in calibrators.groupby(["dataset", "method", "parameter"], sort=False):
            values = group["last_epoch_value"]
            stuck = group.drop_duplicates("run")["calibrator_at_identity"]
            flag = "**NO: never left the identity, effectively uncalibrated**" if stuck.fillna(False).all() else (
                "yes" if not stuck.fillna(False).any() else f"not in {int(stuck.fillna(False).sum())} run(s)")
            lines.append(f"| {dataset} | {method} | {parameter} | {values.median():.3f} [{values.min():.3f}, "
                         f"{values.max():.3f}] | {flag} |")
        lines.append("")
    if not converge.empty and not converge["converged"].all():
        bad = converge[~converge["converged"]]
        lines += ["## Runs that had not settled", "", f"{len(bad)} of {len(converge)} runs (convergence.csv): their "
                  "ranking may change with longer training.", ""]
        lines += [f"- {row.dataset}/{row.method} seed {row.seed}: {row.why_not}" for row in bad.itertuples()] + [""]
    return lines


def write_comparison(runs_paths: list[Path], out: Path, bins: list[int], summary_bins: int) -> Path:
    """Every table and figure of the comparison of the runs under ``runs_paths`` into ``out``; returns ``out``."""
    bins = sorted(set(bins) | {summary_bins})
    notes: list[str] = []
    records = load_runs(runs_paths, notes)
    print(f"{len(records)} run(s): " + ", ".join(sorted({f'{r.dataset}/{r.method}' for r in records})))
    for note in notes:
        print(f"set apart: {note}")
    scores = score_runs(records, bins)
    summary = summary_table(scores)
    errors = calibration_error_table(scores)
    per_task = per_task_table(scores)
    out = output_folder(out, "--out")
    _write_csv(summary, out / "summary.csv")
    _write_csv(errors, out / "calibration_errors.csv")
    _write_csv(per_task, out / "per_task.csv")
    truth_columns = [c for c in summary.columns if c.startswith("nf_") or c.split("_std")[0] in
                     (*MODEL_METRICS, *FLOOR_METRICS)]
    truth_rows = summary[summary[truth_columns].notna().any(axis=1)] if truth_columns else summary.iloc[:0]
    if not truth_rows.empty:
        _write_csv(truth_rows[["dataset", "method", "n_seeds", *truth_columns]], out / "truth.csv")
    pairs = counterpart_pairs({r.method: r.config for r in records})
    paired = paired_differences(scores, pairs, ("nll", "brier", f"ece@{summary_bins}", "accuracy"))
    spread = rank_spread(scores)
    runs = [(r.dataset, r.method, r.seed, r.run_dir) for r in records]
    trajectories = {r.run_dir: calibrator_trajectory(r.run_dir) for r in records}  # each metrics.jsonl read once here
    calibrators, converge = calibrator_table(runs, trajectories), convergence_table(runs)
    weights = task_weight_table(runs)  # runs trained under a multi-task aggregator (mtl.aggregator)
    for frame, name in ((paired, "paired_differences"), (spread, "rank_spread"), (calibrators, "calibrator"),
                        (converge, "convergence"), (weights, "task_weights")):
        if not frame.empty:
            _write_csv(frame, out / f"{name}.csv")
    text = summary_markdown(summary, summary_bins, summary_bins)
    text += "\n\n" + "\n".join(extra_sections(notes, paired, spread, calibrators, converge))
    atomic_write_text(out / "summary.md", text)
    atomic_write_text(out / "summary.tex", summary_latex(summary, summary_bins))
    pooled = pooled_predictions(records)  # every prediction file read once, for the figures and report.html
    figures = write_figures(records, pooled, summary, errors, per_task, out, summary_bins, trajectories, calibrators)
    tables = report_tables(records, pooled, summary=summary, paired=paired, per_task=per_task, calibrators=calibrators,
                           convergence=converge, curves=epoch_curve_table(runs), notes=notes, bins=summary_bins,
                           shift=shift_report.method_shift_table(records))
    report = write_html_report(out / "report.html", tables)
    print(text)
    print(f"{len(figures)} figure(s) and the tables written to {out}")
    print(f"wrote {report}")  # the last line names the page to open
    return out
