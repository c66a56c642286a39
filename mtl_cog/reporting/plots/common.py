"""What every figure shares: the PNG writer and one style per method (colour, marker, dash).

Methods are told apart by three channels at once, so 13 or more stay distinct for every reader:
the colour from Okabe & Ito's colour-blind-safe palette (2008; seven of its eight colours: its
yellow is unreadable as a line on white), a marker and, from the eighth method on, a dash pattern.
The i-th method (sorted order) takes colour i mod 7 and marker i mod 6: the pair repeats only after
42 methods, and neighbours in the sorted list never share a colour or a marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mtl_cog.io import atomic_write

DPI = 110

# Okabe-Ito, https://jfly.uni-koeln.de/color/ (blue, vermillion, bluish green, reddish purple, orange, sky blue, black)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P")  # matplotlib's names; svg_charts draws the same shapes
DASHES = ("", "5 3", "1.5 2.5", "8 3 2 3")  # SVG stroke-dasharray: solid, dashed, dotted, dash-dot


@dataclass(frozen=True)
class MethodStyle:
    color: str  # "#rrggbb"
    marker: str  # one of MARKERS
    dash: str  # one of DASHES ("": solid)

    @property
    def linestyle(self):
        """The dash as matplotlib's line style: "-" or (0, (on, off, ...))."""
        return "-" if not self.dash else (0, tuple(float(v) for v in self.dash.split()))


def method_styles(methods: list[str]) -> dict[str, MethodStyle]:
    """The same style for a method in every figure and chart of a data set (assigned in sorted order)."""
    ordered = sorted(set(map(str, methods)))
    return {m: MethodStyle(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)],
                           DASHES[(i // len(PALETTE)) % len(DASHES)]) for i, m in enumerate(ordered)}


def method_colors(methods: list[str]) -> dict[str, tuple]:
    """The earlier colours (matplotlib's tab10, tab20 beyond 10 methods: near-identical pairs), kept for the
    figures ``docs_tables`` draws into docs/results from committed bundles, which must stay byte-identical until
    they are redrawn; every other figure takes ``method_styles``."""
    ordered = sorted(set(methods))
    cmap = plt.get_cmap("tab10" if len(ordered) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(ordered)}


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write a PNG atomically and close the figure (figures are large; never keep them open)."""
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight"))
    plt.close(figure)
    return Path(path)
