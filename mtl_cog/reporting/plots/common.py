"""What every figure shares: the PNG writer and one colour per method."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mtl_cog.io import atomic_write

DPI = 110


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write a PNG atomically and close the figure (figures are large; never keep them open)."""
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight"))
    plt.close(figure)
    return Path(path)


def method_colors(methods: list[str]) -> dict[str, tuple]:
    """The same colour for a method in every figure of a data set (assigned in sorted order)."""
    ordered = sorted(set(methods))
    cmap = plt.get_cmap("tab10" if len(ordered) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(ordered)}
