"""The leader-rate curve drawn: a matplotlib figure per campaign (``curve_figure``, ``mtl-cog leader-curve``) and
the inline SVG charts of the HTML report and the docs figures (``curve_charts``), both of a ``curve_table``
(``analysis/leader_curve.py``: each metric against the leader/follower ratio, with 95 % intervals).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mtl_cog.analysis.leader_curve import CURVE_METRICS, METRIC_TITLES
from mtl_cog.reporting.svg_charts import Band, Chart, Series


def curve_charts(table: pd.DataFrame, colors: dict[str, str]) -> list[Chart]:
    """One chart per metric of a ``curve_table``: each COG arm a line over the ratios with its interval, each
    reference arm (no ratio) a horizontal band; ``colors`` by arm (grey for one it lacks)."""
    charts = []
    for metric, group in table.groupby("metric", sort=False):
        chart = Chart(METRIC_TITLES.get(metric, f"test {metric}"), "leader / follower learning-rate ratio", metric,
                      log_x=True)
        for arm, points in group.groupby("arm", sort=False):
            color = colors.get(arm, "#555")
            points = points.sort_values("ratio")
            if points["ratio"].isna().all():
                first = points.iloc[0]
                chart.bands.append(Band(str(arm), color, float(first["mean"]), float(first["ci_low"]),
                                        float(first["ci_high"])))
                continue
            points = points[points["ratio"].notna()]
            chart.series.append(Series(str(arm), color, points["ratio"].tolist(), points["mean"].tolist(),
                                       points["ci_low"].tolist(), points["ci_high"].tolist()))
        charts.append(chart)
    return charts


def curve_figure(table: pd.DataFrame, method: str, title: str, metrics: tuple[str, ...] = CURVE_METRICS) -> Figure:
    """Metric vs ratio (log x) with 95 % intervals; each reference arm as a band (its interval) and a line."""
    figure = Figure(figsize=(4.2 * len(metrics), 3.6))
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    curve = table[(table["arm"] == method) & table["ratio"].notna()]
    references = [a for a in dict.fromkeys(table["arm"]) if a != method]
    colors = {arm: f"C{i + 1}" for i, arm in enumerate(references)}
    for ax, metric in zip(axes, metrics):
        rows = curve[curve["metric"] == metric].sort_values("ratio")
        if rows.empty:
            continue
        x = rows["ratio"].to_numpy(dtype=float)
        y = rows["mean"].to_numpy(dtype=float)
        low, high = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
        has_ci = ~np.isnan(low)
        ax.plot(x, y, "o-", color="C0", label=method)
        if has_ci.any():
            ax.errorbar(x[has_ci], y[has_ci], yerr=[y[has_ci] - low[has_ci], high[has_ci] - y[has_ci]], fmt="none",
                        ecolor="C0", capsize=3)
        for arm in references:
            ref = table[(table["arm"] == arm) & table["ratio"].isna() & (table["metric"] == metric)]
            if ref.empty:
                continue
            ref = ref.iloc[0]
            ax.axhline(ref["mean"], color=colors[arm], lw=1.2, label=arm)
            if not math.isnan(ref["ci_low"]):
                ax.axhspan(ref["ci_low"], ref["ci_high"], color=colors[arm], alpha=0.15)
        ax.set_xscale("log")
        ax.set_xlabel("leader / follower learning rate")
        ax.set_title(METRIC_TITLES.get(metric, metric))
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{title}: mean over seeds, 95 % t interval (bands: references)")
    figure.tight_layout()
    return figure
