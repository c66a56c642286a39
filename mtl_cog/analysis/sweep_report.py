"""A sweep's settings compared over seeds, from its results bundle alone.

A sweep whose grid has a ``seed`` axis runs every setting under several seeds, e.g. the question
"does ``train.precision=bf16`` change the results, or only the speed?":

    mtl-cog sweep --data fashion_mnist --method baseline --grid train.precision=no,bf16 seed=0,1,2

A *setting* is what ``campaign.json`` records as a planned run's ``setting`` digest (its config without
the seed and the run's name, ``campaign.setting_digest``). Its label is the overrides that are the same
within a setting and differ between settings: the grid's values, the seed and per-run names left out by
construction. Settings and their grid order (the first run of each, by index) come from every *planned*
run, so a label or the reference does not change while the sweep is still running.

- ``sweep_settings``: per setting, the finished seeds (listed: two means over different seeds differ by
  which seeds they have), the test metrics' task mean as mean ± std over them, the runs that settled
  (``runs.csv``'s ``converged``), and the mean ``wall_s`` (``runs.csv``: seconds of training and
  validation epochs) over the first setting's;
- ``sweep_paired`` (only when some setting has 2 seeds or more): each setting minus the grid's first (the
  reference), paired by seed on the seeds and tasks both have, with the paired t interval and ``better``
  of ``analysis/paired.py``. Its ``reading`` is an equivalence reading: **inside seed noise** when the
  whole 95 % interval lies within ± the seed std (pooled over the two settings: how far a seed moves one
  run's task mean), so that any effect is smaller than a change of seed; **differs** when the interval
  excludes 0; **inconclusive** otherwise: the interval holds 0 but also effects larger than seed noise (with
  3 seeds, t = 4.3 makes this the usual outcome of a small effect). Twelve such intervals per pair of
  settings are twelve 95 % intervals: one in twenty excludes 0 by chance.

A run the bundle records without a ``setting`` (a bundle older than that field) is left out of both.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from mtl_cog.analysis.paired import INCONCLUSIVE, paired_differences
from mtl_cog.bundles.bundle import Bundle, wide_scores

METRICS = ("accuracy", "nll", "brier", "ece@15")
INSIDE, DIFFERS = "inside seed noise", "differs"


def _index(run: str) -> int:
    digits = re.findall(r"\d+", run)
    return int(digits[-1]) if digits else 0


def _planned(bundle: Bundle) -> pd.DataFrame:
    """One row per planned run with a recorded setting: run, setting digest, its overrides, in grid order."""
    rows = []
    for run, record in bundle.campaign.get("specs", {}).items():
        if isinstance(record, dict) and record.get("setting"):
            pairs = (item.split("=", 1) for item in record.get("overrides", []) if "=" in item)
            rows.append({"run": run, "setting": record["setting"], "overrides": dict(pairs)})
    rows.sort(key=lambda r: _index(r["run"]))
    return pd.DataFrame(rows, columns=["run", "setting", "overrides"])


def setting_labels(planned: pd.DataFrame) -> dict[str, str]:
    """setting digest -> label: the overrides constant within each setting that differ between settings."""
    groups = {s: list(g["overrides"]) for s, g in planned.groupby("setting", sort=False)}
    keys = sorted({k for o in planned["overrides"] for k in o})

    def within(key: str, settings: list[dict]) -> set:
        return {o.get(key) for o in settings}

    labelling = [k for k in keys
                 if all(len(within(k, g)) == 1 for g in groups.values())
                 and len({next(iter(within(k, g))) for g in groups.values()}) > 1]
    labels = {s: " ".join(f"{k}={g[0][k]}" for k in labelling if k in g[0]) for s, g in groups.items()}
    if len(set(labels.values())) < len(labels):  # settings the overrides cannot tell apart: name them by digest
        labels = {s: f"{label} [{s[:8]}]".strip() for s, label in labels.items()}
    return {s: label or "(one setting)" for s, label in labels.items()}


def _sweep_scores(bundle: Bundle, planned: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    runs = bundle.done()
    runs = runs[(runs["role"] == "sweep") & runs["run"].isin(set(planned["run"]))]
    scores = wide_scores(bundle, runs)
    own = scores["method"].isin(set(runs["method"]))  # not a post-hoc calibrator's rows (method+ts)
    scores = scores[(scores["split"] == "test") & own]
    setting_of = dict(zip(planned["run"], planned["setting"]))
    return scores.assign(setting=scores["run"].map(setting_of).map(labels))


def _planned_scores(bundle: Bundle) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """(the planned sweep runs, their setting labels, the finished runs' test scores by setting); empty frames
    where the bundle plans no sweep."""
    planned = _planned(bundle)
    if planned.empty:
        return planned, {}, pd.DataFrame()
    labels = setting_labels(planned)
    return planned, labels, _sweep_scores(bundle, planned, labels)


def sweep_settings(bundle: Bundle) -> pd.DataFrame:
    planned, labels, scores = _planned_scores(bundle)
    if scores.empty:
        return pd.DataFrame()
    means = scores[scores["task"] == "mean"]
    runs = bundle.done().set_index("run")
    rows = []
    for setting in dict.fromkeys(planned["setting"].map(labels)):  # grid order, unfinished settings included
        group = means[means["setting"] == setting]
        row = {"setting": setting, "seeds": " ".join(str(s) for s in sorted(group["seed"].unique()))}
        for metric in METRICS:
            values = group[metric].to_numpy(dtype=float)
            row[metric] = ("" if not len(values) else f"{values.mean():.4f}"
                           + (f" ± {values.std(ddof=1):.4f}" if len(values) > 1 else ""))
        finished = runs.loc[list(group["run"])] if len(group) else runs.iloc[:0]
        row["converged"] = f"{int((finished['converged'].astype(str) == 'True').sum())} of {len(finished)}"
        row["wall_s"] = float(pd.to_numeric(finished["wall_s"]).mean()) if len(finished) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    table["wall_vs_first"] = table["wall_s"] / table["wall_s"].iloc[0]  # NaN while the first has no finished run
    return table


def sweep_paired(bundle: Bundle) -> pd.DataFrame:
    """Each setting minus the grid's first, per metric, paired by seed, with an equivalence reading."""
    planned, labels, scores = _planned_scores(bundle)
    if scores.empty:
        return pd.DataFrame()
    order = list(dict.fromkeys(planned["setting"].map(labels)))
    if scores.empty or scores.groupby("setting")["seed"].nunique().max() < 2 or len(order) < 2:
        return pd.DataFrame()
    reference = order[0]
    tasks = scores[scores["task"] != "mean"].assign(dataset="sweep", method=lambda f: f["setting"])
    table = paired_differences(tasks, {s: reference for s in order[1:]}, METRICS)
    if table.empty:
        return table
    table["seed_std"] = [_pooled_seed_std(tasks, row.variant, reference, row.metric) for row in table.itertuples()]
    table["reading"] = [_reading(row) for row in table.itertuples()]
    return table.drop(columns="dataset").rename(columns={"variant": "setting", "counterpart": "reference"})


def _pooled_seed_std(tasks: pd.DataFrame, setting: str, reference: str, metric: str) -> float:
    """The seed std of one run's task mean, pooled over the two settings (on their shared seeds and tasks)."""
    per_seed = {s: tasks[tasks["setting"] == s].pivot_table(index="seed", columns="task", values=metric)
                for s in (setting, reference)}
    seeds = per_seed[setting].index.intersection(per_seed[reference].index)
    columns = per_seed[setting].columns.intersection(per_seed[reference].columns)
    if len(seeds) < 2:
        return math.nan
    variances = [per_seed[s].loc[seeds, columns].mean(axis=1).var(ddof=1) for s in (setting, reference)]
    return float(np.sqrt(np.mean(variances)))


def _reading(row) -> str:
    if math.isnan(row.ci_low) or math.isnan(row.seed_std):
        return INCONCLUSIVE
    if row.better != INCONCLUSIVE:
        return DIFFERS
    return INSIDE if -row.seed_std <= row.ci_low and row.ci_high <= row.seed_std else INCONCLUSIVE
