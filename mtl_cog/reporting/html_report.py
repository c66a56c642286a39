"""One self-contained ``report.html`` of a comparison: tables, verdicts, curves and a reliability diagram per task.

``write_html_report(path, tables)`` takes plain pandas tables (``ReportTables``), so any source can
feed it: ``compare`` builds them from run folders (``mtl_cog.reporting.comparison``), a results
bundle can build them from its CSV files. The page needs no network: figures are inline SVG
(``mtl_cog.reporting.svg_charts``), style and script are inline (``mtl_cog.reporting.html_assets``).
Sections appear only when their table has rows, in this order per data set: summary (sortable),
Pareto fronts (accuracy vs NLL and Brier), paired verdicts, leader curves, convergence, learned
calibrators, per task (a picker over every task, worst first by a chosen metric, with a filter: each
method's reliability diagram side by side and the task's metrics), worst tasks and per-task ECE
(multi-task data), subgroups, shift. The cross-task sections and the picker live in ``html_tasks``. Every table
sorts from a header's click or, focused, Enter or Space (``aria-sort`` says how it is sorted).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.evaluation.metrics import lower_is_better
from mtl_cog.io import atomic_write_text
from mtl_cog.reporting.curve_figures import curve_charts
from mtl_cog.reporting.html_assets import SCRIPT, STYLE, SVG_DEFS
from mtl_cog.reporting.html_tasks import (
    ALL_TASKS,
    WORST_K,
    diagram,
    order_metrics,
    ordered_tasks,
    pareto_html,
    per_task_chart,
    picker_html,
    task_scores,
    worst_tasks_html,
)
from mtl_cog.reporting.method_titles import method_title
from mtl_cog.reporting.plots import MethodStyle, method_styles
from mtl_cog.reporting.svg_charts import Chart, Series, dot_strip_svg, legend_key_svg, line_chart_svg

__all__ = ["ALL_TASKS", "ReportTables", "report_html", "write_html_report"]


@dataclass
class ReportTables:
    """The report's input: plain tables, one row per observation. Only ``summary`` is required.

    Column names in brackets are optional; metric columns are named as everywhere in the project
    (``accuracy``, ``nll``, ``brier``, ``ece@15``, ``smece``, ...), with ``<metric>_std`` beside a mean
    when a spread over seeds exists.

    - ``summary``: one row per (dataset, method): dataset, method, n_seeds, metric columns, [avg_rank],
      [top_ranked] (``mtl_cog.reporting.tables.summary_table``).
    - ``paired``: one row per (dataset, variant, metric): dataset, variant, counterpart, metric,
      mean_difference, ci_low, ci_high, n_seeds, n_tasks, better (``variant`` / ``counterpart`` /
      ``inconclusive``; ``mtl_cog.analysis.paired.paired_differences``).
    - ``per_task``: one row per (dataset, method, task): metric columns (``tables.per_task_table``).
    - ``reliability``: one row per (dataset, method, task, bin): dataset, method, task, bin (0..B-1 of
      B uniform bins on [0, 1]), n_bins, count, mean_confidence, frequency, [mean_truth]; seeds pooled;
      task ``ALL_TASKS`` for every task pooled (``evaluation.binning.reliability_bins``).
    - ``curves``: per-epoch values: dataset, method, seed, epoch, split, metric, value (a bundle's
      ``curves.csv.gz`` with the run's dataset, method and seed joined on).
    - ``convergence``: one row per run: dataset, method, seed, epochs, nll_gain_last_20pct,
      calibrator_move_last_20pct, converged, why_not (``trajectories.convergence_table``).
    - ``calibrators``: one row per (run, parameter, task): dataset, method, seed, parameter, task,
      last_epoch_value, calibrator_at_identity (``trajectories.calibrator_table``).
    - ``leader_curve``: one row per (arm, ratio, metric): [dataset], arm, ratio (empty for a reference
      arm drawn as a band), metric, mean, ci_low, ci_high, n_seeds (``leader_curve.curve_table``).
    - ``shift``: dataset, method, [seed], severity (0 = clean), metric columns (task means over corruptions;
      ``shift_report.method_shift_table``); averaged over seeds here.
    - ``subgroups``: dataset, method, [seed], group, value, task, n, metric columns (a run's
      ``group_metrics.csv`` with its dataset, method and seed); averaged over seeds and tasks here.
    - ``notes``: lines shown at the top under ``notes_title`` (a comparison: the runs set apart and why);
      ``bins``: the bin count of the summary's binned errors; ``title``, ``subtitle``: the page heading.
    - ``sections``: (heading, note, table) shown as they are, before the data sets: a results bundle's
      answers (verdicts with both tuning draws, the paper's claims, the tuning's choices, calibrators, runs
      that did not settle), each a plain sortable table.
    """

    summary: pd.DataFrame
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    per_task: pd.DataFrame = field(default_factory=pd.DataFrame)
    reliability: pd.DataFrame = field(default_factory=pd.DataFrame)
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    convergence: pd.DataFrame = field(default_factory=pd.DataFrame)
    calibrators: pd.DataFrame = field(default_factory=pd.DataFrame)
    leader_curve: pd.DataFrame = field(default_factory=pd.DataFrame)
    shift: pd.DataFrame = field(default_factory=pd.DataFrame)
    subgroups: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)
    notes_title: str = "Runs set apart"
    sections: list[tuple[str, str, pd.DataFrame]] = field(default_factory=list)
    bins: int = SUMMARY_BINS
    title: str = "Comparison of methods"
    subtitle: str = ""


def shown_metrics(bins: int) -> list[str]:
    """The metric columns a table shows, in this order, where present."""
    return ["accuracy", "nll", "brier", f"ece@{bins}", f"rmsce@{bins}", f"mce@{bins}", "smece", f"adaece@{bins}",
            f"classwise_ece@{bins}", "aurc", f"worst_group_ece@{bins}", "multicalibration_smece", f"nf_ece@{bins}",
            "prob_error"]


def _rows(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    if frame is None or frame.empty:
        return pd.DataFrame()
    return frame[frame["dataset"] == dataset] if "dataset" in frame else frame


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _number(value) -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4f}"


def _cell(value, std=None, klass: str = "") -> str:
    """A numeric cell: the value to sort by in data-v, mean ± std as text."""
    if value is None or pd.isna(value):
        return f'<td{klass} data-v="">–</td>'
    spread = "" if std is None or pd.isna(std) else f'<span class="sd">± {float(std):.4f}</span>'  # a second line
    return f'<td{klass} data-v="{float(value):.10g}">{_number(float(value))}{spread}</td>'


def _header(names: list[str], sorted_by: str | None = None) -> str:
    """A sortable table's header row: every header focusable (Tab, then Enter or Space sorts), long names allowed
    to wrap after ``_`` and before ``@`` (every column fits at 1,400 px), ``aria-sort`` on the column the rows
    are already sorted by (ascending)."""
    def cell(name: str) -> str:
        text = escape(name).replace("_", "_<wbr>").replace("@", "<wbr>@")
        state = ' aria-sort="ascending"' if name == sorted_by else ""
        return f'<th tabindex="0" scope="col"{state}>{text}</th>'
    return f"<thead><tr>{''.join(map(cell, names))}</tr></thead>"


def _arrow(metric: str) -> str:
    return f"{metric} {'↓' if lower_is_better(metric) else '↑'}"


def summary_html(rows: pd.DataFrame, bins: int) -> str:
    metrics = [m for m in shown_metrics(bins) if m in rows and rows[m].notna().any()]
    ranked = "avg_rank" in rows
    # the average rank next to the method: the column a reader looks for first, never the one off-screen
    names = ["method", *(["avg rank ↓"] if ranked else []), "seeds", *map(_arrow, metrics)]
    body = []
    order = rows.sort_values("avg_rank", kind="stable") if ranked else rows
    for _, row in order.iterrows():
        top = bool(row.get("top_ranked", False))
        cells = [_method_cell(str(row["method"]), " ★" if top else ""),
                 *([_cell(row["avg_rank"])] if ranked else []),
                 f'<td data-v="{row.get("n_seeds", "")}">{row.get("n_seeds", "")}</td>']
        cells += [_cell(row[m], row.get(f"{m}_std")) for m in metrics]
        body.append(f'<tr{" class=top" if top else ""}>{"".join(cells)}</tr>')
    header = _header(names, "avg rank ↓" if ranked else None)
    return (f'<div class="scroll"><table class="sortable summary">{header}<tbody>{"".join(body)}'
            "</tbody></table></div>")


def frame_html(frame: pd.DataFrame) -> str:
    """Any table as a sortable HTML table: numbers to 4 decimals (sorted as numbers), empty cells empty."""
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for value in row:
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                cells.append(_cell(value) if isinstance(value, (float, np.floating)) else
                             f'<td data-v="{value}">{value}</td>')
            else:
                text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
                cells.append(f"<td class=l>{escape(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="sortable">{_header([str(c) for c in frame.columns])}'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def paired_html(rows: pd.DataFrame) -> str:
    names = ["variant", "counterpart", "metric", "difference", "95% interval", "seeds × tasks", "better"]
    body = []
    for row in rows.itertuples():
        interval = "one seed: no interval" if pd.isna(row.ci_low) else f"[{row.ci_low:+.4f}, {row.ci_high:+.4f}]"
        body.append(f"<tr><td>{escape(str(row.variant))}</td><td class=l>{escape(str(row.counterpart))}</td>"
                    f"<td class=l>{escape(str(row.metric))}</td>"
                    f'<td data-v="{row.mean_difference:.10g}">{row.mean_difference:+.4f}</td>'
                    f'<td data-v="{row.ci_low if not pd.isna(row.ci_low) else ""}">{interval}</td>'
                    f"<td>{row.n_seeds} × {row.n_tasks}</td>"
                    f'<td class="l {escape(str(row.better))}">{escape(str(row.better))}</td></tr>')
    return (f'<table class="sortable paired">{_header(names)}<tbody>{"".join(body)}</tbody></table>')


def _method_cell(method: str, suffix: str = "") -> str:
    title = method_title(method)
    hint = "" if title == method else f' title="{escape(title)}"'
    return f"<td{hint}>{escape(method)}{suffix}</td>"


def _legend(styles: dict[str, MethodStyle], shown: list[str]) -> str:
    """Each method's key (colour, marker, dash: what tells 13+ methods apart in every chart), name and what a
    post-hoc name stands for."""
    return '<div class="legend">' + "".join(
        f"<span>{legend_key_svg(styles[m].color, styles[m].marker, styles[m].dash)}{escape(m)}"
        + ("" if method_title(m) == m else f' <i>{escape(method_title(m).partition(" + ")[2])}</i>') + "</span>"
        for m in shown) + "</div>"


def _series(label: str, style: MethodStyle | None, x: list, y: list) -> Series:
    style = style or MethodStyle("#555555", "o", "")
    return Series(label, style.color, x, y, marker=style.marker, dash=style.dash)


def leader_html(rows: pd.DataFrame, styles: dict[str, MethodStyle]) -> str:
    charts = curve_charts(rows, {m: s.color for m, s in styles.items()})
    for chart in charts:  # curve_charts colours each arm; its marker and dash come from the same style
        for series in chart.series:
            if series.label in styles:
                series.marker, series.dash = styles[series.label].marker, styles[series.label].dash
    return f'<div class="charts">{"".join(line_chart_svg(c) for c in charts)}</div>'


def convergence_html(curves: pd.DataFrame, table: pd.DataFrame, styles: dict[str, MethodStyle]) -> str:
    parts = []
    if not curves.empty:
        charts = []
        for (split, metric), group in curves.groupby(["split", "metric"], sort=False):
            chart = Chart(f"{split} {metric} per epoch (mean over seeds)", "epoch", metric)
            for method, points in group.groupby("method", sort=False):
                mean = points.groupby("epoch")["value"].mean()
                chart.series.append(_series(str(method), styles.get(method), mean.index.tolist(), mean.tolist()))
            charts.append(line_chart_svg(chart))
        parts.append(f'<div class="charts">{"".join(charts)}</div>')
    if not table.empty:
        names = ["method", "seed", "epochs", "NLL gain, last 20%", "calibrator move, last 20%", "settled", "why not"]
        body = []
        for row in table.itertuples():
            settled = bool(row.converged)
            body.append(f'<tr{"" if settled else " class=bad"}><td>{escape(str(row.method))}</td>'
                        f"<td>{row.seed}</td><td>{row.epochs}</td>{_cell(row.nll_gain_last_20pct)}"
                        f"{_cell(getattr(row, 'calibrator_move_last_20pct', None))}"
                        f'<td class=l>{"yes" if settled else "no"}</td>'
                        f'<td class=l>{escape(str(row.why_not or ""))}</td></tr>')
        parts.append(f'<table class="sortable">{_header(names)}<tbody>{"".join(body)}</tbody></table>')
    return "".join(parts)


def calibrators_html(rows: pd.DataFrame, styles: dict[str, MethodStyle]) -> str:
    names = ["method", "parameter", "median", "min", "max", "left the identity"]
    body, strips = [], []
    for (method, parameter), group in rows.groupby(["method", "parameter"], sort=False):
        values = group["last_epoch_value"].astype(float)
        stuck = group.drop_duplicates(["seed"])["calibrator_at_identity"].fillna(False).astype(bool)
        flag = "no: never left the identity" if stuck.all() else ("yes" if not stuck.any() else
                                                                 f"not in {int(stuck.sum())} run(s)")
        body.append(f'<tr{" class=bad" if stuck.all() else ""}><td>{escape(str(method))}</td>'
                    f"<td class=l>{escape(str(parameter))}</td>{_cell(values.median())}{_cell(values.min())}"
                    f"{_cell(values.max())}<td class=l>{flag}</td></tr>")
        per_task = group.groupby("task", sort=False)["last_epoch_value"].mean()
        strips.append((f"{method}: {parameter}", styles[method].color if method in styles else "#555",
                       [(str(t), float(v)) for t, v in per_task.items()]))
    strip = dot_strip_svg(strips, "last-epoch value per task (mean over seeds); dashed: the identity",
                          "calibrator value", reference=1.0 if all("temperature" in s[0] or "scale" in s[0]
                                                                   for s in strips) else None)
    return (f'<table class="sortable">{_header(names)}<tbody>{"".join(body)}</tbody></table>'
            f'<div class="scroll">{strip}</div>')


def _task_metrics(rows: pd.DataFrame, bins: int) -> str:
    metrics = [m for m in shown_metrics(bins) if m in rows and rows[m].notna().any()]
    body = []
    for _, row in rows.iterrows():
        cells = "".join(_cell(row[m], row.get(f"{m}_std")) for m in metrics)
        body.append(f'<tr>{_method_cell(str(row["method"]))}{cells}</tr>')
    return (f'<div class="scroll"><table class="sortable">{_header(["method", *map(_arrow, metrics)])}'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def tasks_html(dataset: str, reliability: pd.DataFrame, per_task: pd.DataFrame, methods: list[str],
               summary: pd.DataFrame, bins: int) -> str:
    """The task picker (worst first by a chosen metric, a filter box) and one hidden panel per task: each method's
    reliability diagram and the task's metrics."""
    orders = order_metrics(per_task, bins)
    scores = task_scores(per_task, orders)
    tasks = ordered_tasks(reliability, per_task, scores, orders)
    if not tasks:
        return ""
    by_task = {task: group for task, group in reliability.groupby("task", sort=False)} if not reliability.empty \
        else {}
    metrics_by_task = {task: group for task, group in per_task.groupby("task", sort=False)} if not per_task.empty \
        else {}
    panels = []
    for task in tasks:
        diagrams = []
        bins_of = by_task.get(task, pd.DataFrame())
        for method in methods:
            rows = bins_of[bins_of["method"] == method].sort_values("bin") if not bins_of.empty else bins_of
            if not rows.empty:
                diagrams.append(diagram(str(method), rows, "pooled ECE" if task == ALL_TASKS else "ECE"))
        metrics = metrics_by_task.get(task)
        if metrics is None and task == ALL_TASKS:
            metrics = summary  # the task mean: the summary's numbers
        table = "" if metrics is None or metrics.empty else _task_metrics(metrics, bins)
        panels.append(f'<div class="task-panel" data-task="{escape(task)}"'
                      f'{"" if task == tasks[0] else " hidden"}><div class="diagrams">{"".join(diagrams)}</div>'
                      f"{table}</div>")
    return (f'<div class="task-view" data-dataset="{escape(dataset)}" data-shown="{escape(tasks[0])}">'
            f'{picker_html(tasks, scores, orders)}{"".join(panels)}</div>')


def shift_html(rows: pd.DataFrame, styles: dict[str, MethodStyle], bins: int) -> str:
    metrics = [m for m in ("accuracy", "nll", "brier", f"ece@{bins}", "smece", "aurc") if m in rows]
    means = rows.drop(columns=[c for c in ("dataset", "seed") if c in rows]).groupby(
        ["method", "severity"], sort=False)[metrics].mean().reset_index()
    charts = []
    for metric in metrics:
        chart = Chart(f"{metric} under corruption", "severity (0 = clean)", metric)
        for method, points in means.groupby("method", sort=False):
            points = points.sort_values("severity")
            chart.series.append(_series(str(method), styles.get(method), points["severity"].tolist(),
                                        points[metric].tolist()))
        charts.append(line_chart_svg(chart, width=320, height=220))
    return f'<div class="charts">{"".join(charts)}</div>'


def subgroups_html(rows: pd.DataFrame, methods: list[str], bins: int) -> str:
    metric = next((m for m in (f"ece@{bins}", "smece", "accuracy") if m in rows), None)
    if metric is None:
        return ""
    cells = rows.groupby(["group", "value", "method"], sort=False)[[metric, "n"]].mean()
    present = [m for m in methods if m in set(rows["method"])]
    body = []
    for (group, value), block in cells.groupby(level=[0, 1], sort=False):
        block = block.droplevel([0, 1])
        n = block["n"].mean()
        values = "".join(_cell(block.loc[m, metric]) if m in block.index else '<td data-v="">–</td>'
                         for m in present)
        body.append(f"<tr><td>{escape(str(group))} = {escape(str(value))}</td><td data-v=\"{n:.6g}\">"
                    f"{n:,.0f}</td>{values}</tr>")
    names = ["group", "samples (mean per task)", *present]
    return (f'<p class="note">{escape(metric)} inside each group, mean over tasks and seeds.</p>'
            f'<div class="scroll"><table class="sortable">{_header(names)}<tbody>{"".join(body)}</tbody>'
            "</table></div>")


def dataset_html(dataset: str, tables: ReportTables) -> str:
    summary = _rows(tables.summary, dataset)
    methods = list(dict.fromkeys(summary["method"]))
    arms = [a for a in _rows(tables.leader_curve, dataset).get("arm", []) if a not in methods]
    styles = method_styles(methods + arms)
    anchor = _slug(dataset)
    parts = [f'<section class="dataset" id="ds-{anchor}"><h2>{escape(dataset)}</h2>', "<h3>Summary</h3>",
             '<p class="note">Test-set metrics, mean ± std over distinct seeds (no ± with one seed); task mean for '
             "multi-task data." + (" Average rank over accuracy, NLL and Brier (1 = best); ★ = top-ranked."
                                   if "avg_rank" in summary else "")
             + " Click a header (or focus it and press Enter) to sort.</p>", summary_html(summary, tables.bins),
             _legend(styles, methods)]
    pareto = pareto_html(summary, styles)
    if pareto:
        parts += ["<h3>Pareto fronts</h3>", '<p class="note">Accuracy against NLL and against Brier, one marker per '
                  "method (test, task mean, mean over seeds). Ringed, named and joined: the methods no other method "
                  "beats on both axes at once (the Pareto front).</p>", pareto]
    paired = _rows(tables.paired, dataset)
    if not paired.empty:
        parts += ["<h3>COG variants against their counterparts (paired)</h3>",
                  '<p class="note">Mean difference variant − counterpart, 95% t interval over seeds of the '
                  "task-averaged differences; <i>better</i> names the side the interval excludes zero for.</p>",
                  paired_html(paired)]
    leader = _rows(tables.leader_curve, dataset)
    if not leader.empty:
        parts += ["<h3>Leader curves</h3>", '<p class="note">Each metric against the leader/follower ratio (mean '
                  "over seeds, 95% interval shaded); dashed bands: reference methods.</p>", leader_html(leader, styles)]
    curves, converge = _rows(tables.curves, dataset), _rows(tables.convergence, dataset)
    if not curves.empty or not converge.empty:
        parts += ["<h3>Convergence</h3>", '<p class="note">Settled: the best validation NLL improved by at most 1% '
                  "in the last 20% of epochs and the calibrator made at most 10% of its move there.</p>",
                  convergence_html(curves, converge, styles)]
    calibrators = _rows(tables.calibrators, dataset)
    if not calibrators.empty:
        parts += ["<h3>Learned calibrators</h3>", calibrators_html(calibrators, styles)]
    task_view = tasks_html(dataset, _rows(tables.reliability, dataset), _rows(tables.per_task, dataset), methods,
                           summary, tables.bins)
    per_task = _rows(tables.per_task, dataset)
    spread = "mean ± std" if any(str(c).endswith("_std") for c in per_task.columns) else "the mean"
    if task_view and tables.reliability.empty:  # a results bundle: the task metrics, no reliability diagrams
        parts += [f'<h3 id="tasks-{anchor}">Per task</h3>',
                  f'<p class="note">Test metrics of every method on the chosen task, {spread} over seeds.</p>',
                  task_view]
    elif task_view:
        parts += [f'<h3 id="tasks-{anchor}">Per task</h3>',
                  '<p class="note">Reliability diagrams of every method on the chosen task (test set, every seed\'s '
                  f"predictions pooled, so its ECE is of the pool; the table gives {spread} over seeds): blue, "
                  "observed frequency per bin; hatched red, the gap to the bin's mean confidence; black dots, mean "
                  "true probability where known; grey, predictions per bin (log). "
                  "Hover a bar for its numbers.</p>", task_view]
    ece = f"ece@{tables.bins}" if f"ece@{tables.bins}" in per_task else "smece"
    if per_task.get("task", pd.Series()).nunique() > 1 and ece in per_task and per_task[ece].notna().any():
        parts += ["<h3>Worst tasks</h3>", f'<p class="note">Each method\'s {WORST_K} worst-calibrated tasks by {ece} '
                  "(test, mean over seeds), the worst first; a task opens in the per-task view above.</p>",
                  worst_tasks_html(per_task, methods, ece), "<h3>Per-task ECE</h3>",
                  f'<p class="note">Every task\'s {ece} for every method: a row per task, the worst (mean over '
                  "methods) on top; hover a marker for its value.</p>",
                  f'<div class="scroll">{per_task_chart(per_task, methods, ece, styles)}</div>']
    subgroups = _rows(tables.subgroups, dataset)
    if not subgroups.empty:
        parts += ["<h3>Subgroups</h3>", subgroups_html(subgroups, methods, tables.bins)]
    # shift tables name their severity suite in the data set ("synthetic (cifar10c)"): two suites are never pooled
    shift = tables.shift
    if not shift.empty:
        shift = shift[(shift["dataset"] == dataset) | shift["dataset"].astype(str).str.startswith(f"{dataset} (")]
    for label, rows in ([] if shift.empty else shift.groupby("dataset", sort=True)):
        suite = str(label)[len(dataset):].strip()
        parts += [f"<h3>Under corruption shift{(' ' + escape(suite)) if suite else ''}</h3>",
                  '<p class="note">Task means averaged over corruptions and seeds, against severity.</p>',
                  shift_html(rows, styles, tables.bins)]
    return "".join(parts) + "</section>"


def report_html(tables: ReportTables) -> str:
    """The whole page as one string."""
    if tables.summary is None or tables.summary.empty:
        raise ValueError("the report needs a summary table with at least one row")
    datasets = list(dict.fromkeys(tables.summary["dataset"]))
    has_tasks = {d: not (_rows(tables.per_task, d).empty and _rows(tables.reliability, d).empty) for d in datasets}
    nav = "".join(f'<a href="#ds-{_slug(d)}">{escape(d)}</a>'  # a per-task link only where that panel exists
                  + (f'<a href="#tasks-{_slug(d)}">{escape(d)}: per task</a>' if has_tasks[d] else "")
                  for d in datasets)
    notes = "" if not tables.notes else (f"<h3>{escape(tables.notes_title)}</h3><ul>" +
                                         "".join(f"<li>{escape(n)}</li>" for n in tables.notes) + "</ul>")
    notes += "".join(f'<section class="campaign"><h2>{escape(heading)}</h2><p class="note">{escape(note)}</p>'
                     f"{frame_html(frame)}</section>" for heading, note, frame in tables.sections if not frame.empty)
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(tables.title)}</title><style>{STYLE}</style></head><body>{SVG_DEFS}"
            f"<header><h1>{escape(tables.title)}</h1>"
            f'{f"<p>{escape(tables.subtitle)}</p>" if tables.subtitle else ""}<nav>{nav}</nav></header>'
            f'<main>{notes}{"".join(dataset_html(d, tables) for d in datasets)}</main>'
            f"<script>{SCRIPT}</script></body></html>\n")


def write_html_report(path: str | Path, tables: ReportTables) -> Path:
    """Write ``report_html(tables)`` to ``path`` atomically; -> the path."""
    atomic_write_text(Path(path), report_html(tables))
    return Path(path)
