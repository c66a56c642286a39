"""report.html's sections across methods and tasks: the Pareto fronts, the worst tasks, per-task ECE, the task picker.

Split from ``html_report`` (the page and its other sections) because these four read the same two
tables, the summary and the per-task metrics, and the picker's sort order is the worst-tasks order.
Every chart marks a method with its ``plots.common.method_styles`` style (colour-blind-safe colour,
marker, dash), so 13 or more methods stay apart. A task's name links to ``#task=NAME``, which the
page's script opens in the picker.
"""

from __future__ import annotations

import math
from html import escape

import numpy as np
import pandas as pd

from mtl_cog.evaluation.metrics import lower_is_better
from mtl_cog.reporting.plots import MethodStyle, pareto_front
from mtl_cog.reporting.svg_charts import Point, reliability_svg, scatter_svg, task_dots_svg

ALL_TASKS = "all tasks pooled"  # the reliability table's task for every task of a data set pooled
WORST_K = 5  # tasks per method in the worst-tasks table


def order_metrics(per_task: pd.DataFrame, bins: int) -> list[str]:
    """The metrics the picker can order tasks by (worst first), those the per-task table has, ECE first."""
    return [m for m in (f"ece@{bins}", "smece", "nll", "brier", "accuracy") if m in per_task and
            per_task[m].notna().any()]


def task_scores(per_task: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per task, each metric's mean over methods (the picker's and the worst-tasks' order)."""
    if per_task.empty or not metrics:
        return pd.DataFrame()
    return per_task.groupby("task", sort=False)[metrics].mean()


def worst_first(scores: pd.DataFrame, metric: str) -> list[str]:
    """Task names, the worst by ``metric`` first (highest for a loss or error, lowest for accuracy); NaN last."""
    ordered = scores[metric].sort_values(ascending=not lower_is_better(metric), na_position="last", kind="stable")
    return [str(t) for t in ordered.index]


def pareto_html(summary: pd.DataFrame, styles: dict[str, MethodStyle]) -> str:
    """Accuracy against NLL and against Brier, one point per method, the non-dominated ones ringed and joined."""
    charts = []
    for metric, label in (("nll", "NLL ↓"), ("brier", "Brier ↓")):
        if metric not in summary or "accuracy" not in summary:
            continue
        rows = summary[summary["accuracy"].notna() & summary[metric].notna()]
        if len(rows) < 2:
            continue
        front = pareto_front(rows["accuracy"].to_numpy(float), rows[metric].to_numpy(float))
        points = [Point(str(m), styles[str(m)], float(a), float(v), bool(f))
                  for m, a, v, f in zip(rows["method"], rows["accuracy"], rows[metric], front)]
        charts.append(scatter_svg(points, f"accuracy vs {metric.upper() if metric == 'nll' else 'Brier'}",
                                  "accuracy ↑", label))
    return f'<div class="charts">{"".join(charts)}</div>' if charts else ""


def worst_tasks_html(per_task: pd.DataFrame, methods: list[str], metric: str) -> str:
    """Each method's ``WORST_K`` worst tasks by ``metric``, each a link that opens the task in the picker."""
    rows = []
    for method in methods:
        mine = per_task[per_task["method"] == method].dropna(subset=[metric])
        if mine.empty:
            continue
        mine = mine.sort_values(metric, ascending=not lower_is_better(metric), kind="stable").head(WORST_K)
        cells = "".join(f'<td class=l data-v="{v:.10g}"><a href="#task={escape(str(t))}">{escape(str(t))}</a> '
                        f"{v:.4f}</td>" for t, v in zip(mine["task"], mine[metric]))
        rows.append(f"<tr><td>{escape(str(method))}</td>{cells}</tr>")
    names = ["method", *(f"{k}." for k in range(1, WORST_K + 1))]
    head = "".join(f'<th tabindex="0" scope="col">{escape(n)}</th>' for n in names)
    return (f'<div class="scroll"><table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            "</tbody></table></div>")


def per_task_chart(per_task: pd.DataFrame, methods: list[str], metric: str, styles: dict[str, MethodStyle]) -> str:
    """Every task a row, the worst (mean over methods) on top, each method's ``metric`` as its marker."""
    order = worst_first(task_scores(per_task, [metric]), metric)
    values = per_task.set_index(["task", "method"])[metric]
    rows = [(task, [(m, styles[m], float(values.get((task, m), np.nan))) for m in methods]) for task in order]
    return task_dots_svg(rows, f"{metric} per task, each method a marker (worst task on top; click a task to open it)",
                         f"{metric} (test, mean over seeds)", link="task")


def picker_html(tasks: list[str], scores: pd.DataFrame, metrics: list[str]) -> str:
    """The picker's controls: the task list (worst first by the first metric), the order, a filter box."""
    def option(task: str) -> str:
        values = " ".join("" if task not in scores.index or pd.isna(scores.at[task, m]) else f"{scores.at[task, m]:.6g}"
                          for m in metrics)
        pin = ' data-pin="1"' if task == ALL_TASKS else ""
        return f'<option value="{escape(task)}" data-m="{values}"{pin}>{escape(task)}</option>'
    orders = "".join(f'<option value="{escape(m)}">worst {escape(m)} first</option>' for m in metrics)
    directions = " ".join("1" if lower_is_better(m) else "-1" for m in metrics)
    return (f'<div class="picker" data-metrics="{escape(" ".join(metrics))}" data-directions="{directions}">'
            f'<label>task <select class="task" aria-label="task">{"".join(map(option, tasks))}</select></label>'
            '<button type="button" data-step="-1">◀ previous</button><button type="button" data-step="1">next ▶'
            f'</button><label>order <select class="order" aria-label="order of the tasks">{orders}'
            '<option value="">by name</option></select></label><label>filter <input type="search" class="filter" '
            'placeholder="part of a task name" aria-label="filter the tasks"></label>'
            f'<span class="count">{len(tasks)} tasks</span><span class="hint">link to one with #task=NAME</span></div>')


def ordered_tasks(reliability: pd.DataFrame, per_task: pd.DataFrame, scores: pd.DataFrame,
                  metrics: list[str]) -> list[str]:
    """Every task of the data set: the pooled entry first, then worst first by the first metric (no metric: as
    they came)."""
    tasks = [str(t) for t in dict.fromkeys([*reliability.get("task", []), *per_task.get("task", [])])]
    rest = [t for t in tasks if t != ALL_TASKS]
    if metrics and not scores.empty:
        rank = {t: i for i, t in enumerate(worst_first(scores, metrics[0]))}
        rest.sort(key=lambda t: rank.get(t, len(rank)))
    return ([ALL_TASKS] if ALL_TASKS in tasks else []) + rest


def diagram(method: str, rows: pd.DataFrame, label: str) -> str:
    """One method's reliability diagram from its bin rows; the subtitle's ECE is of the pooled predictions."""
    count = rows["count"].to_numpy(dtype=float)
    confidence, frequency = rows["mean_confidence"].to_numpy(dtype=float), rows["frequency"].to_numpy(dtype=float)
    ece = float(np.nansum(count * np.abs(frequency - confidence)) / count.sum()) if count.sum() > 0 else math.nan
    truth = rows["mean_truth"].to_numpy(dtype=float) if "mean_truth" in rows else None
    subtitle = f"{label}@{int(rows['n_bins'].iloc[0])} {ece:.4f} · n {int(count.sum()):,}"
    return reliability_svg(count, confidence, frequency, method, subtitle,
                           truth if truth is not None and np.isfinite(truth).any() else None)
