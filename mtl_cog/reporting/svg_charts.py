"""Small inline SVG charts for the HTML report: reliability diagrams from bin statistics, line charts, dot strips.

Drawn as text rather than by matplotlib because the report holds hundreds of them (40 tasks x 10
methods): an SVG of a reliability diagram is ~3 KB and stays sharp at any zoom, where a PNG of the
same is ~30 KB as a data URI. Each mark carries a ``<title>`` (the browser's tooltip) with its
numbers, so a reader can check a bar without a table. No script is needed to display them.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from html import escape

import numpy as np

GAP_COLOR, BAR_COLOR, COUNT_COLOR = "#c44e52", "#4c72b0", "#999"


def _n(value: float) -> str:
    """A coordinate with one decimal (enough at screen resolution; keeps 400 diagrams small)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _fmt(value: float) -> str:
    """A number for a label or tooltip: 4 significant digits."""
    return "–" if value is None or not np.isfinite(value) else f"{value:.4g}"


def reliability_svg(count, mean_confidence, frequency, title: str, subtitle: str = "", mean_truth=None,
                    size: int = 160) -> str:
    """A reliability diagram of one method on one task, from its uniform bins (``evaluation.binning.reliability_bins``).

    Blue bars: observed frequency per bin; hatched red: the gap to the bin's mean confidence; dashed:
    perfect calibration; black dots: the bin's mean true probability where known; grey strip under
    it: predictions per bin on a log scale (a large gap in a bin of 3 predictions is noise).
    """
    count = np.asarray(count, dtype=float)
    n_bins = len(count)
    left, top, strip = 30, 34, 30
    width, height = left + size + 8, top + size + strip + 26
    x = lambda v: left + v * size  # noqa: E731 (two one-line maps, clearer inline than as functions)
    y = lambda v: top + (1 - v) * size  # noqa: E731
    bin_width = size / n_bins
    parts = [f'<svg class="rel" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)} {escape(subtitle)}">',
             f'<text x="{left}" y="13" class="t">{escape(title)}</text>',
             f'<text x="{left}" y="27" class="s">{escape(subtitle)}</text>',
             f'<rect x="{left}" y="{top}" width="{size}" height="{size}" class="frame"/>']
    strip_top = top + size + 18
    biggest = max(count.max(initial=0), 1)
    for b in range(n_bins):
        if count[b] <= 0:
            continue
        freq, conf = float(frequency[b]), float(mean_confidence[b])
        truth = "" if mean_truth is None or not np.isfinite(mean_truth[b]) else f", mean p* {_fmt(mean_truth[b])}"
        tip = (f"bin [{b / n_bins:.3g}, {(b + 1) / n_bins:.3g}): {int(count[b]):,} predictions, mean confidence "
               f"{_fmt(conf)}, observed {_fmt(freq)}{truth}")
        low, high = sorted((freq, conf))
        strip_h = strip * math.log1p(count[b]) / math.log1p(biggest)
        parts.append(
            f'<g><title>{escape(tip)}</title>'
            f'<rect x="{_n(x(b / n_bins))}" y="{_n(y(freq))}" width="{_n(bin_width)}" height="{_n(freq * size)}" '
            f'class="bar"/>'
            f'<rect x="{_n(x(b / n_bins))}" y="{_n(y(high))}" width="{_n(bin_width)}" '
            f'height="{_n((high - low) * size)}" class="gap"/>'
            f'<rect x="{_n(x(b / n_bins))}" y="{_n(strip_top + strip - strip_h)}" width="{_n(bin_width)}" '
            f'height="{_n(strip_h)}" class="cnt"/></g>')
        if mean_truth is not None and np.isfinite(mean_truth[b]):
            parts.append(f'<circle cx="{_n(x(conf))}" cy="{_n(y(float(mean_truth[b])))}" r="2" class="truth"/>')
    parts.append(f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" class="diag"/>')
    for tick in (0, 0.5, 1):
        parts.append(f'<text x="{_n(x(tick))}" y="{top + size + 11}" class="k" text-anchor="middle">{tick:g}</text>'
                     f'<text x="{left - 3}" y="{_n(y(tick) + 3)}" class="k" text-anchor="end">{tick:g}</text>')
    parts.append(f'<text x="{left}" y="{height - 2}" class="k">per bin (log scale), max {int(biggest):,}</text>')
    return "".join(parts) + "</svg>"


def marker_svg(shape: str, cx: float, cy: float, r: float, color: str, extra: str = "") -> str:
    """One point drawn as ``shape`` (``plots.common.MARKERS``: o s ^ D v P), so methods that share a colour
    stay apart; ``extra``: more attributes (a stroke, an opacity)."""
    fill = f'fill="{color}"{extra}'
    if shape == "s":
        return f'<rect x="{_n(cx - r)}" y="{_n(cy - r)}" width="{_n(2 * r)}" height="{_n(2 * r)}" {fill}/>'
    points = {"^": [(0, -1.25), (1.1, 0.85), (-1.1, 0.85)], "v": [(0, 1.25), (1.1, -0.85), (-1.1, -0.85)],
              "D": [(0, -1.3), (1.3, 0), (0, 1.3), (-1.3, 0)],
              "P": [(-.4, -1.2), (.4, -1.2), (.4, -.4), (1.2, -.4), (1.2, .4), (.4, .4), (.4, 1.2), (-.4, 1.2),
                    (-.4, .4), (-1.2, .4), (-1.2, -.4), (-.4, -.4)]}.get(shape)
    if points is None:
        return f'<circle cx="{_n(cx)}" cy="{_n(cy)}" r="{_n(r)}" {fill}/>'
    return f'<polygon points="{" ".join(f"{_n(cx + a * r)},{_n(cy + b * r)}" for a, b in points)}" {fill}/>'


def legend_key_svg(color: str, marker: str = "o", dash: str = "") -> str:
    """A legend's key: a short line in the method's dash with its marker on it (report.html's legends)."""
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<svg width="26" height="12" viewBox="0 0 26 12" aria-hidden="true"><line x1="1" x2="25" y1="6" y2="6" '
            f'stroke="{color}" stroke-width="2"{dashed}/>{marker_svg(marker, 13, 6, 3.6, color)}</svg>')


@dataclass
class Series:
    """One line of a line chart; ``low``/``high`` (same length as ``y``) draw a band around it; ``marker`` and
    ``dash`` (``plots.common.method_styles``) tell apart methods that share a colour."""

    label: str
    color: str
    x: list[float]
    y: list[float]
    low: list[float] | None = None
    high: list[float] | None = None
    marker: str = "o"
    dash: str = ""


@dataclass
class Band:
    """A horizontal reference (a method without the chart's x, e.g. the tuned baseline on a leader curve)."""

    label: str
    color: str
    y: float
    low: float | None = None
    high: float | None = None


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    log_x: bool = False


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if not (np.isfinite(low) and np.isfinite(high)) or high <= low:
        return [low] if np.isfinite(low) else []
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((high - first) / step + 1e-9) + 1)]


# What a chart needs of report.html's style sheet (html_assets.STYLE), for an SVG file shown on its own (a docs
# figure: GitHub shows it as an image, which sees no page style and no script).
STANDALONE_STYLE = ("text{font:10px system-ui,sans-serif;fill:#333}text.t{font-size:12px;font-weight:600}"
                    ".frame{fill:none;stroke:#bbb}.grid{stroke:#eee}")
LEGEND_ROW = 16
TITLE_ROW, TITLE_CHAR = 15, 7  # a 12 px bold title: its line height, ~7 px a character


def _legend_width(label: str) -> int:
    return 26 + 6 * len(label)  # an 18 px swatch, a gap, ~6 px a character at 10 px


def _legend_rows(chart: Chart, width: int, left: int) -> list[list[tuple[str, str, bool]]]:
    """The chart's series and bands as (label, colour, is_band), in rows that fit the width."""
    entries = [(s.label, s.color, False) for s in chart.series] + [(b.label, b.color, True) for b in chart.bands]
    rows, used = [[]], 0
    for entry in entries:
        need = _legend_width(entry[0])
        if rows[-1] and left + used + need > width:
            rows.append([])
            used = 0
        rows[-1].append(entry)
        used += need
    return [row for row in rows if row]


def line_chart_svg(chart: Chart, width: int = 360, height: int = 240, standalone: bool = False) -> str:
    """Lines (with optional bands) against x, horizontal reference bands, axes with round ticks; ``log_x`` for
    ratios spanning decades. ``standalone``: an SVG file of its own (a docs figure): its own style, a white
    background and a legend under the axes (inline in report.html the page's style and legend serve)."""
    left, right, top, bottom = 58, 10, 24, 38
    legend = _legend_rows(chart, width, left) if standalone else []
    # a title longer than the chart is wide wraps (an SVG text never does), the axes moving down to make room
    title = textwrap.wrap(chart.title, max(20, (width - left - right) // TITLE_CHAR)) or [""]
    top += TITLE_ROW * (len(title) - 1)
    height += LEGEND_ROW * len(legend) + TITLE_ROW * (len(title) - 1)
    plot_w, plot_h = width - left - right, height - top - bottom - LEGEND_ROW * len(legend)
    xs = [v for s in chart.series for v in s.x if np.isfinite(v) and (v > 0 or not chart.log_x)]
    ys = [v for s in chart.series for v in [*s.y, *(s.low or []), *(s.high or [])] if np.isfinite(v)]
    ys += [v for b in chart.bands for v in (b.y, b.low, b.high) if v is not None and np.isfinite(v)]
    if not xs or not ys:
        return ""
    fx = (lambda v: math.log10(v)) if chart.log_x else (lambda v: v)
    x_low, x_high = fx(min(xs)), fx(max(xs))
    x_low, x_high = (x_low - 0.5, x_high + 0.5) if x_low == x_high else (x_low, x_high)
    y_low, y_high = min(ys), max(ys)
    pad = (y_high - y_low) * 0.06 or abs(y_high) * 0.05 or 1.0
    y_low, y_high = y_low - pad, y_high + pad
    px = lambda v: left + (fx(v) - x_low) / (x_high - x_low) * plot_w  # noqa: E731
    py = lambda v: top + (1 - (v - y_low) / (y_high - y_low)) * plot_h  # noqa: E731
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(chart.title)}">',
             *(f'<text x="{left}" y="{14 + TITLE_ROW * i}" class="t">{escape(line)}</text>'
               for i, line in enumerate(title)),
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    if standalone:
        parts[1:1] = [f"<style>{STANDALONE_STYLE}</style>", f'<rect width="{width}" height="{height}" fill="#fff"/>']
    for row_index, row in enumerate(legend):
        y, x = top + plot_h + 48 + LEGEND_ROW * row_index, left
        for label, color, is_band in row:
            dash = ' stroke-dasharray="5 3"' if is_band else ""
            parts.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 3}" y2="{y - 3}" stroke="{color}" stroke-width="2"'
                         f'{dash}/><text x="{x + 22}" y="{y}">{escape(label)}</text>')
            x += _legend_width(label)
    for tick in nice_ticks(y_low, y_high):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{_n(py(tick))}" y2="{_n(py(tick))}" class="grid"/>'
                     f'<text x="{left - 4}" y="{_n(py(tick) + 3)}" class="k" text-anchor="end">{tick:.4g}</text>')
    if chart.log_x:
        x_ticks = [10.0**p for p in range(math.floor(x_low), math.ceil(x_high) + 1) if x_low <= p <= x_high]
    else:
        x_ticks = nice_ticks(x_low, x_high, 6)
    for tick in x_ticks:
        parts.append(f'<text x="{_n(px(tick))}" y="{top + plot_h + 13}" class="k" text-anchor="middle">{tick:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 32}" class="k" text-anchor="middle">'
                 f'{escape(chart.x_label)}</text>'
                 f'<text x="12" y="{top + plot_h / 2}" class="k" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + plot_h / 2})">{escape(chart.y_label)}</text>')
    for band in chart.bands:
        tip = f"{band.label}: {_fmt(band.y)}" + ("" if band.low is None or not np.isfinite(band.low) else
                                                  f" [{_fmt(band.low)}, {_fmt(band.high)}]")
        parts.append(f'<g><title>{escape(tip)}</title>')
        if band.low is not None and np.isfinite(band.low) and np.isfinite(band.high):
            parts.append(f'<rect x="{left}" width="{plot_w}" y="{_n(py(band.high))}" '
                         f'height="{_n(py(band.low) - py(band.high))}" fill="{band.color}" opacity="0.15"/>')
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{_n(py(band.y))}" y2="{_n(py(band.y))}" '
                     f'stroke="{band.color}" stroke-dasharray="5 3" stroke-width="1.5"/></g>')
    for series in chart.series:
        points = [(px(a), py(b), a, b) for a, b in zip(series.x, series.y)
                  if np.isfinite(b) and np.isfinite(a) and (a > 0 or not chart.log_x)]
        if series.low is not None and series.high is not None:
            band = [(px(a), py(lo), py(hi)) for a, lo, hi in zip(series.x, series.low, series.high)
                    if np.isfinite(lo) and np.isfinite(hi) and (a > 0 or not chart.log_x)]
            if len(band) > 1:
                outline = [f"{_n(u)},{_n(hi)}" for u, _, hi in band] + [f"{_n(u)},{_n(lo)}" for u, lo, _ in band[::-1]]
                parts.append(f'<polygon points="{" ".join(outline)}" fill="{series.color}" opacity="0.15"/>')
        if len(points) > 1:
            line = " ".join(f"{_n(u)},{_n(v)}" for u, v, _, _ in points)
            dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
            parts.append(f'<polyline points="{line}" fill="none" stroke="{series.color}" stroke-width="1.6"{dash}/>')
        for u, v, a, b in points:
            tip = f"<title>{escape(series.label)}: {_fmt(b)} at {_fmt(a)}</title>"
            shape = marker_svg(series.marker, u, v, 2.8, series.color)
            parts.append(f'<circle cx="{_n(u)}" cy="{_n(v)}" r="2.5" fill="{series.color}">{tip}</circle>'
                         if series.marker == "o" else f"<g>{tip}{shape}</g>")
    return "".join(parts) + "</svg>"


def dot_strip_svg(rows: list[tuple[str, str, list[tuple[str, float]]]], title: str, x_label: str,
                  reference: float | None = None, width: int = 520) -> str:
    """One row of dots per label: ``rows`` = (label, colour, [(name, value), ...]); a dashed line at
    ``reference`` (e.g. the identity temperature 1). For values across tasks, e.g. a learned calibrator."""
    values = [v for _, _, dots in rows for _, v in dots if np.isfinite(v)]
    if not values:
        return ""
    left, right, top, row_h = 150, 12, 24, 18
    height = top + row_h * len(rows) + 34
    low, high = min(values + ([reference] if reference is not None else [])), max(
        values + ([reference] if reference is not None else []))
    pad = (high - low) * 0.05 or 0.05
    low, high = low - pad, high + pad
    plot_w = width - left - right
    px = lambda v: left + (v - low) / (high - low) * plot_w  # noqa: E731
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="4" y="14" class="t">{escape(title)}</text>']
    bottom = top + row_h * len(rows)
    for tick in nice_ticks(low, high):
        parts.append(f'<line x1="{_n(px(tick))}" x2="{_n(px(tick))}" y1="{top}" y2="{bottom}" class="grid"/>'
                     f'<text x="{_n(px(tick))}" y="{bottom + 12}" class="k" text-anchor="middle">{tick:.4g}</text>')
    if reference is not None:
        parts.append(f'<line x1="{_n(px(reference))}" x2="{_n(px(reference))}" y1="{top}" y2="{bottom}" '
                     'class="diag"/>')
    for i, (label, color, dots) in enumerate(rows):
        cy = top + row_h * i + row_h / 2
        parts.append(f'<text x="{left - 6}" y="{_n(cy + 3)}" class="k" text-anchor="end">{escape(label)}</text>')
        for name, value in dots:
            if np.isfinite(value):
                parts.append(f'<circle cx="{_n(px(value))}" cy="{_n(cy)}" r="3" fill="{color}" opacity="0.7">'
                             f'<title>{escape(name)}: {_fmt(value)}</title></circle>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" class="k" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    return "".join(parts) + "</svg>"


@dataclass
class Point:
    """One method in a scatter: its style (``plots.common.MethodStyle``), position and whether it is on the front."""

    label: str
    style: object
    x: float
    y: float
    front: bool = False


def _axis(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    return low - pad, high + pad


def scatter_svg(points: list[Point], title: str, x_label: str, y_label: str, width: int = 400,
                height: int = 280) -> str:
    """Methods as points (x higher is better, y lower is better: accuracy against a loss); the non-dominated
    ones (``front``) ringed in black, named, and joined by a thick line: the Pareto front."""
    points = [p for p in points if np.isfinite(p.x) and np.isfinite(p.y)]
    if not points:
        return ""
    left, right, top, bottom = 58, 12, 24, 38
    plot_w, plot_h = width - left - right, height - top - bottom
    (x_low, x_high), (y_low, y_high) = _axis([p.x for p in points]), _axis([p.y for p in points])
    px = lambda v: left + (v - x_low) / (x_high - x_low) * plot_w  # noqa: E731
    py = lambda v: top + (1 - (v - y_low) / (y_high - y_low)) * plot_h  # noqa: E731
    parts = [f'<svg class="chart" width="{width}" height="{height}" '  # inline only: no namespace needed
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{left}" y="14" class="t">{escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    for tick in nice_ticks(y_low, y_high):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{_n(py(tick))}" y2="{_n(py(tick))}" class="grid"/>'
                     f'<text x="{left - 4}" y="{_n(py(tick) + 3)}" class="k" text-anchor="end">{tick:.4g}</text>')
    for tick in nice_ticks(x_low, x_high, 6):
        parts.append(f'<text x="{_n(px(tick))}" y="{top + plot_h + 13}" class="k" text-anchor="middle">'
                     f"{tick:.4g}</text>")
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" class="k" text-anchor="middle">'
                 f"{escape(x_label)}</text>"
                 f'<text x="12" y="{top + plot_h / 2}" class="k" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + plot_h / 2})">{escape(y_label)}</text>')
    front = sorted((p for p in points if p.front), key=lambda p: p.x)
    if len(front) > 1:
        line = " ".join(f"{_n(px(p.x))},{_n(py(p.y))}" for p in front)
        parts.append(f'<polyline points="{line}" class="front"/>')
    for p in sorted(points, key=lambda p: p.front):  # the front drawn last, on top
        ring = ' stroke="#000" stroke-width="1.4"' if p.front else ""
        parts.append(f"<g><title>{escape(p.label)}: {x_label.split()[0]} {_fmt(p.x)}, {y_label.split()[0]} "
                     f"{_fmt(p.y)}{' (on the front)' if p.front else ''}</title>"
                     f"{marker_svg(p.style.marker, px(p.x), py(p.y), 5 if p.front else 4, p.style.color, ring)}</g>")
        if p.front:  # named beside the marker, on the side with room (right of it in the plot's left 60 %)
            right_side = px(p.x) < left + 0.6 * plot_w
            anchor = "" if right_side else ' text-anchor="end"'
            parts.append(f'<text x="{_n(px(p.x) + (7 if right_side else -7))}" y="{_n(py(p.y) - 5)}" class="k"'
                         f"{anchor}>{escape(p.label)}</text>")
    return "".join(parts) + "</svg>"


OPAQUE = ' opacity="0.85"'  # overlapping markers of one task stay visible under each other


def task_dots_svg(rows: list[tuple[str, list[tuple[str, object, float]]]], title: str, x_label: str,
                  link: str = "", width: int = 760) -> str:
    """One row per task (``rows`` = (task, [(method, style, value), ...]), in the order given), each method's
    value as its marker; a task's name links to ``#<link>task=NAME`` (the task picker) when ``link`` is set."""
    values = [v for _, dots in rows for _, _, v in dots if np.isfinite(v)]
    if not values:
        return ""
    left, right, top, row_h = 150, 14, 24, 16
    height = top + row_h * len(rows) + 32
    pad = (max(values) - min(values)) * 0.05 or abs(max(values)) * 0.05 or 0.05
    low, high = min(values) - pad, max(values) + pad  # the values' range: differences between methods show
    plot_w = width - left - right
    px = lambda v: left + (v - low) / (high - low) * plot_w  # noqa: E731
    bottom = top + row_h * len(rows)
    parts = [f'<svg class="chart" width="{width}" height="{height}" '  # inline only: no namespace needed
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="4" y="14" class="t">{escape(title)}</text>']
    for tick in nice_ticks(low, high):
        parts.append(f'<line x1="{_n(px(tick))}" x2="{_n(px(tick))}" y1="{top}" y2="{bottom}" class="grid"/>'
                     f'<text x="{_n(px(tick))}" y="{bottom + 12}" class="k" text-anchor="middle">{tick:.4g}</text>')
    for i, (task, dots) in enumerate(rows):
        cy = top + row_h * i + row_h / 2
        if i % 2:
            parts.append(f'<rect x="{left}" y="{_n(cy - row_h / 2)}" width="{plot_w}" height="{row_h}" class="band"/>')
        name = f'<text x="{left - 6}" y="{_n(cy + 3)}" class="k" text-anchor="end">{escape(task)}</text>'
        parts.append(f'<a href="#task={escape(task)}">{name}</a>' if link else name)
        for method, style, value in dots:
            if np.isfinite(value):
                parts.append(f"<g><title>{escape(task)}, {escape(method)}: {_fmt(value)}</title>"
                             + marker_svg(style.marker, px(value), cy, 3.6, style.color, OPAQUE) + "</g>")
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" class="k" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    return "".join(parts) + "</svg>"
