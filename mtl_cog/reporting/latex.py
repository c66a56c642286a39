"""The summary table as LaTeX (booktabs): one ``table`` per data set, the top-ranked methods in bold."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.evaluation.metrics import (
    BASE_METRICS,
)
from mtl_cog.reporting.tables import seeds_cell

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))


def _latex_cell(mean: float, std: float, digits: int = 4) -> str:
    if pd.isna(mean):
        return "--"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} $\\pm$ {std:.{digits}f}"


def summary_latex(summary: pd.DataFrame, bins: int) -> str:
    """summary.md's tables as LaTeX, one ``table`` per data set (booktabs rules; top-ranked in bold).

    ``\\input`` it in a document that loads ``booktabs``. Cells are joined by pandas' Styler.to_latex.
    """
    columns = [*BASE_METRICS, f"ece@{bins}"]
    headers = ["Method", "Seeds", "Acc. $\\uparrow$", "NLL $\\downarrow$", "Brier $\\downarrow$",
               f"ECE@{bins} $\\downarrow$", "Avg. rank $\\downarrow$"]
    parts = ["% Written by scripts/compare.py; needs \\usepackage{booktabs}. Mean $\\pm$ std over distinct seeds."]
    for dataset, group in summary.groupby("dataset", sort=False):
        rows = []
        for _, row in group.sort_values("avg_rank", kind="stable").iterrows():
            cells = [latex_escape(row["method"]), latex_escape(seeds_cell(row)),
                     *(_latex_cell(row.get(c, np.nan), row.get(f"{c}_std", np.nan)) for c in columns),
                     f"{row['avg_rank']:.2f}"]
            if row["top_ranked"]:
                cells = [f"\\textbf{{{c}}}" for c in cells]
            rows.append(cells)
        body = pd.DataFrame(rows, columns=headers).style.hide(axis="index").to_latex(
            hrules=True, column_format="l" + "r" * (len(headers) - 1))
        parts += ["\\begin{table}[t]", "\\centering", f"\\caption{{{latex_escape(dataset)}: test metrics "
                  f"(mean over tasks), average rank over accuracy, NLL and Brier; bold: top-ranked.}}",
                  body.rstrip(), "\\end{table}", ""]
    return "\n".join(parts)
