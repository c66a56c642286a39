"""A sweep's settings compared over seeds, from its results bundle alone.

A sweep whose grid has a ``seed`` axis runs every setting under several seeds, e.g. the question
"does ``train.precision=bf16`` change the results, or only the speed?":

    mtl-cog sweep --data fashion_mnist --method baseline --grid train.precision=no,bf16 seed=0,1,2

- ``sweep_settings``: per setting (the grid values except the seed, read from ``campaign.json``'s
  recorded overrides), the test metrics' task mean as mean ± std over its seeds, the mean wall seconds
  per run and how many runs settled under the convergence rule;
- ``sweep_paired``: each setting minus the *first* one of the grid (the reference), paired by seed
  (same initialisation and data order), with the paired t interval of ``reporting/paired.py``. Its
  ``reading``: **inside seed noise** when the interval contains 0 *and* the difference is smaller than
  the reference's own seed std (what one more seed of the reference could move); **differs** when the
  interval excludes 0; **inconclusive** otherwise (too few seeds to tell a real change from noise).

Settings are never pooled: runs with other recorded overrides are other rows.
"""

from __future__ import annotations

import math

import pandas as pd

from mtl_cog.reporting.bundle import Bundle, wide_scores
from mtl_cog.reporting.paired import seed_t_interval
from mtl_cog.reporting.trajectories import convergence_of_curves

METRICS = ("accuracy", "nll", "brier", "ece@15")
NOT_A_SETTING = ("seed", "output_dir", "run_name", "wandb_group", "wandb_job_type")
INSIDE, DIFFERS, INCONCLUSIVE = "inside seed noise", "differs", "inconclusive"


def _overrides(record: dict) -> dict[str, str]:
    """``key=value`` overrides of one recorded spec as {key: value}, the last one of a key winning."""
    pairs = (item.split("=", 1) for item in record.get("overrides", []) if "=" in item)
    return {key: value for key, value in pairs}


def setting_labels(bundle: Bundle) -> pd.Series:
    """run -> its setting's label: the overrides that differ between the sweep's runs, the seed left out."""
    runs = bundle.runs[bundle.runs["role"] == "sweep"]["run"]
    specs = bundle.campaign.get("specs", {})
    overrides = {run: _overrides(specs.get(run, {})) for run in runs}
    keys = sorted({k for o in overrides.values() for k in o} - set(NOT_A_SETTING))
    varying = [k for k in keys if len({o.get(k) for o in overrides.values()}) > 1]
    return pd.Series({run: " ".join(f"{k}={o[k]}" for k in varying if k in o) or "(one setting)"
                      for run, o in overrides.items()}, dtype=object)


def _sweep_scores(bundle: Bundle) -> pd.DataFrame:
    runs = bundle.done()
    runs = runs[runs["role"] == "sweep"]
    scores = wide_scores(bundle, runs)
    scores = scores[scores["split"] == "test"]
    labels = setting_labels(bundle)
    return scores.assign(setting=scores["run"].map(labels))


def _order(bundle: Bundle) -> list[str]:
    """The settings in grid order (the order of their first run's name, run_00 first)."""
    labels = setting_labels(bundle)
    return list(dict.fromkeys(labels.sort_index()))


def sweep_settings(bundle: Bundle) -> pd.DataFrame:
    scores = _sweep_scores(bundle)
    if scores.empty:
        return pd.DataFrame()
    means = scores[scores["task"] == "mean"]
    runs = bundle.done().set_index("run")
    rows = []
    for setting in [s for s in _order(bundle) if s in set(means["setting"])]:
        group = means[means["setting"] == setting]
        names = list(group["run"])
        settled = [convergence_of_curves(bundle.curves[bundle.curves["run"] == r]) for r in names]
        row = {"setting": setting, "seeds": group["seed"].nunique(),
               "converged": sum(bool(c is not None and c.converged) for c in settled)}
        for metric in METRICS:
            values = group[metric].to_numpy(dtype=float)
            row[metric] = f"{values.mean():.4f}" + (f" ± {values.std(ddof=1):.4f}" if len(values) > 1 else "")
        row["wall_s"] = float(pd.to_numeric(runs.loc[names, "wall_s"]).mean())
        rows.append(row)
    table = pd.DataFrame(rows)
    table["time_ratio"] = table["wall_s"] / table["wall_s"].iloc[0]
    return table


def sweep_paired(bundle: Bundle) -> pd.DataFrame:
    """Each setting minus the grid's first, per metric, paired by seed (seeds both have only)."""
    scores = _sweep_scores(bundle)
    order = [s for s in _order(bundle) if s in set(scores["setting"])]
    if len(order) < 2:
        return pd.DataFrame()
    reference = order[0]
    rows = []
    for setting in order[1:]:
        for metric in METRICS:
            ref = scores[scores["setting"] == reference].pivot_table(index="seed", columns="task", values=metric)
            other = scores[scores["setting"] == setting].pivot_table(index="seed", columns="task", values=metric)
            ref, other = ref.drop(columns="mean"), other.drop(columns="mean")
            seeds = sorted(set(ref.index) & set(other.index))
            if not seeds:
                continue
            diff = other.loc[seeds, ref.columns].to_numpy(dtype=float) - ref.loc[seeds].to_numpy(dtype=float)
            mean, low, high = seed_t_interval(diff)
            ref_std = float(ref.loc[seeds].mean(axis=1).std(ddof=1)) if len(seeds) > 1 else math.nan
            if math.isnan(low):
                reading = INCONCLUSIVE
            elif not low <= 0 <= high:
                reading = DIFFERS
            else:
                reading = INSIDE if abs(mean) <= ref_std else INCONCLUSIVE
            rows.append({"setting": setting, "reference": reference, "metric": metric, "seeds": len(seeds),
                         "difference": mean, "low": low, "high": high, "reference_seed_std": ref_std,
                         "reading": reading})
    return pd.DataFrame(rows, columns=["setting", "reference", "metric", "seeds", "difference", "low", "high",
                                       "reference_seed_std", "reading"]) if rows else pd.DataFrame()
