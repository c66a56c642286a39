"""The leader-rate curve blocks of a curve lane's bundle (runs of role ``curve``): ``curve``, per arm and ratio the
mean over seeds of the task-mean test metric with its 95 % t interval; ``curve_paired``, per ratio COG minus its
reference paired by seed (the campaign's counterpart, else the baseline; and COG itself at ratio 1 for the ratios
below 1) and which side the interval favours. A reference arm has no ratio; ``baseline+ts`` is the baseline runs'
``test+ts`` split."""

import numpy as np
import pandas as pd

from claims_audit.bundle import Bundle
from claims_audit.page import Audit, kept, keys
from claims_audit.rule import reading, t_interval

CURVE_METRICS = ("nll", "brier", "ece@15", "smece", "accuracy")  # the curve's metrics where a marker names none
BETTER = {"supported": "variant", "contradicted": "counterpart"}  # any other reading: 'inconclusive'


def ratio_cell(ratio: float) -> str:
    """A ratio as the page prints it: 4 decimals, blank for a reference arm."""
    return "" if np.isnan(ratio) else f"{ratio:.4f}"


def arms(bundle: Bundle) -> set[tuple[str, float]]:
    """(arm, ratio) of every curve point: each method at each ratio, and each post-hoc split ``test+X`` of a
    method's runs as the arm ``method+X``."""
    splits = bundle.means.index.to_frame(index=False)[["run", "split"]].drop_duplicates()
    found = set()
    for run in bundle.curves.itertuples():
        found.add((run.method, float(run.ratio)))
        posthoc = splits[(splits["run"] == run.run) & splits["split"].str.startswith("test+")]["split"]
        found |= {(f"{run.method}+{split[5:]}", float(run.ratio)) for split in posthoc}
    return found


def per_seed(bundle: Bundle, arm: str, ratio: float, metric: str) -> pd.Series:
    """Task-mean test ``metric`` of one curve point per seed."""
    runs = bundle.curves[bundle.curves["method"] == arm.partition("+")[0]]
    # the ratio as a run folder names it (6 significant digits), a reference arm has none
    same = runs["ratio"].isna() if np.isnan(ratio) else [f"{r:.6g}" == f"{ratio:.6g}" for r in runs["ratio"]]
    runs = runs[same]
    return pd.Series(bundle.task_means(runs["run"], arm, metric), index=runs["seed"].astype(int).to_numpy()).dropna()


def audit_curve(audit: Audit, where: str, bundle: Bundle, rows: list[dict], header: list[str], head: str) -> None:
    known = {"arm", "ratio", "metric", "mean", "ci_low", "ci_high", "n_seeds", "n_tasks", "data"}
    audit.columns(where, header, known, known)
    points = {(arm, ratio_cell(ratio)): ratio for arm, ratio in arms(bundle)}  # found by the cell the page prints
    key = ("arm", "ratio", "metric")
    audit.coverage(where, keys(rows, key), kept(head, key, [(*point, m) for point in points for m in CURVE_METRICS]))
    for row in rows:
        label = f"{where}: {row['arm']}, {row['ratio'] or 'reference'}, {row['metric']}"
        ratio = points.get((row["arm"], row["ratio"]))
        values = per_seed(bundle, row["arm"], ratio, row["metric"]) if ratio is not None else pd.Series(dtype=float)
        mean, low, high, _ = t_interval(values)
        for column, ours in {"mean": mean, "ci_low": low, "ci_high": high}.items():
            audit.number(f"{label}: {column}", row[column], ours)
        audit.text(f"{label}: n_seeds", row["n_seeds"], str(len(values)))
        audit.text(f"{label}: n_tasks", row["n_tasks"], str(bundle.n_tasks))
        audit.text(f"{label}: data", row["data"], ", ".join(sorted(bundle.data)))


def paired_rows(bundle: Bundle) -> dict[tuple[str, str, str, str], pd.Series]:
    """(method, ratio cell, metric, reference label) -> the per-seed differences the page's row is read on."""
    found = {}
    for method in sorted(set(bundle.curves.loc[bundle.curves["ratio"].notna(), "method"])):
        ratios = sorted({float(r) for r in bundle.curves.loc[bundle.curves["method"] == method, "ratio"].dropna()})
        counterpart = bundle.counterparts.get(method, "baseline")
        references = [(counterpart, np.nan, counterpart, ratios), (method, 1.0, f"{method}@1", [r for r in ratios
                                                                                               if r < 1])]
        for reference, at, name, compared in references:
            for ratio in compared:
                for metric in CURVE_METRICS:
                    mine, theirs = per_seed(bundle, method, ratio, metric), per_seed(bundle, reference, at, metric)
                    differences = (mine - theirs).dropna()
                    if len(differences):
                        found[(method, ratio_cell(ratio), metric, name)] = differences
    return found


def audit_curve_paired(audit: Audit, where: str, bundle: Bundle, rows: list[dict], header: list[str],
                       head: str) -> None:
    known = {"ratio", "metric", "reference", "mean_difference", "ci_low", "ci_high", "n_seeds", "better", "data",
             "method"}
    audit.columns(where, header, known, known)
    expected, key = paired_rows(bundle), ("method", "ratio", "metric", "reference")
    audit.coverage(where, keys(rows, key), kept(head, key, expected))
    for row in rows:
        key = (row["method"], row["ratio"], row["metric"], row["reference"])
        label = f"{where}: {row['method']} at {row['ratio']} − {row['reference']}, {row['metric']}"
        differences = expected.get(key, pd.Series(dtype=float))
        mean, low, high, _ = t_interval(differences)
        for column, ours in {"mean_difference": mean, "ci_low": low, "ci_high": high}.items():
            audit.number(f"{label}: {column}", row[column], ours)
        audit.text(f"{label}: n_seeds", row["n_seeds"], str(len(differences)))
        lower_better = -1 if row["metric"] != "accuracy" else 1  # the variant is better below 0, accuracy above
        audit.text(f"{label}: better", row["better"],
                   BETTER.get(reading(low, high, lower_better, len(differences)), "inconclusive"))
        audit.text(f"{label}: data", row["data"], ", ".join(sorted(bundle.data)))
