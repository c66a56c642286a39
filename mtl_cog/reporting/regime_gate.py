"""Is a regime overconfident enough for a calibration method to show anything? The regime gate, from a sweep's bundle.

A comparison of calibration methods can only find a gain where there is miscalibration to remove. The gate of
``docs/results/overconfident-plan.md`` asks of a configuration (the baseline, mean over tasks, over >= 3 seeds):

1. test ECE@15 at least ``GATE_ECE`` (0.03), and
2. post-hoc temperature scaling, fitted on the run's validation split, lowers the test NLL by at least
   ``GATE_TS_GAIN`` (5 %) relative, with a 95 % t interval over seeds (of the per-seed relative change) that
   excludes 0.

``regime_gate`` reads it per sweep setting (``sweep_report.setting_labels``: the grid's values) and per checkpoint
rule: the *selected* checkpoint (best validation Brier, the paper's: results splits ``val``, ``test``,
``test+ts``) and the *last* epoch (``eval.score_last_epoch``: ``val@last``, ``test@last``, ``test@last+ts``).
``val_nll`` is the validation NLL of the same checkpoint, what a tuning would choose the setting by: the *tuned*
baseline is the setting with the lowest one. Only what the bundle holds is read; a setting without the splits
(a sweep run without ``--posthoc ts`` or without the last epoch scored) gets an empty row for that rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.reporting.bundle import Bundle
from mtl_cog.reporting.paired import seed_t_interval
from mtl_cog.reporting.sweep_report import _planned, setting_labels

GATE_ECE = 0.03
GATE_TS_GAIN = 0.05
RULES = {"best validation Brier": "", "last epoch": "@last"}  # checkpoint rule -> the tag of its results splits


def _task_means(bundle: Bundle, runs: list[str]) -> pd.DataFrame:
    """run x (split, metric) of the task means."""
    results = bundle.results
    means = results[(results["task"] == "mean") & results["run"].isin(runs)]
    return means.pivot_table(index="run", columns=["split", "metric"], values="value", aggfunc="first")


def regime_gate(bundle: Bundle) -> pd.DataFrame:
    """One row per sweep setting and checkpoint rule: seeds, val NLL, test ECE@15, TS's relative NLL change with its
    95 % interval, and whether the gate passes (module docstring)."""
    planned = _planned(bundle)
    done = bundle.done()
    if planned.empty or done.empty:
        return pd.DataFrame()
    labels = setting_labels(planned)
    setting_of = dict(zip(planned["run"], planned["setting"].map(labels)))
    done = done[done["run"].isin(setting_of) & (done["role"] == "sweep")]  # a sweep's runs: a grid of settings
    if done.empty:
        return pd.DataFrame()
    wide = _task_means(bundle, list(done["run"]))
    rows = []
    for setting in dict.fromkeys(planned["setting"].map(labels)):
        runs = [r for r in done["run"] if setting_of[r] == setting]
        for rule, tag in RULES.items():
            needed = [(f"val{tag}", "nll"), (f"test{tag}", "ece@15"), (f"test{tag}", "nll"), (f"test{tag}+ts", "nll")]
            have = [r for r in runs if r in wide.index and all(c in wide.columns and np.isfinite(wide.at[r, c])
                                                               for c in needed)]
            planned_seeds = int((planned["setting"].map(labels) == setting).sum())
            row = {"setting": setting, "rule": rule, "seeds": f"{len(have)} of {planned_seeds}"}
            if have:
                cells = wide.loc[have]
                change = (cells[(f"test{tag}+ts", "nll")] - cells[(f"test{tag}", "nll")]) / cells[(f"test{tag}", "nll")]
                mean, low, high = seed_t_interval(change.to_numpy(dtype=float)[:, None])
                ece = float(cells[(f"test{tag}", "ece@15")].mean())
                row.update({"val_nll": float(cells[(f"val{tag}", "nll")].mean()), "test_ece@15": ece,
                            "test_nll": float(cells[(f"test{tag}", "nll")].mean()),
                            "test_nll+ts": float(cells[(f"test{tag}+ts", "nll")].mean()),
                            "ts_nll_change": mean, "ci_low": low, "ci_high": high,
                            "passes": bool(len(have) >= 3 and ece >= GATE_ECE and mean <= -GATE_TS_GAIN
                                           and high < 0)})
            if len(have) < len(runs):  # a finished run without every value the gate reads: said, not hidden
                row["note"] = f"{len(runs) - len(have)} finished run(s) lack a value the gate reads"
            rows.append(row)
    table = pd.DataFrame(rows)
    complete = all(str(s).split(" of ")[0] == str(s).split(" of ")[1] for s in table["seeds"])
    if "val_nll" in table and complete:  # the tuned baseline: the lowest validation NLL once every setting finished
        selected = table[table["rule"] == next(iter(RULES))]
        tuned = selected.loc[selected["val_nll"].idxmin(), "setting"] if selected["val_nll"].notna().any() else None
        table["tuned"] = np.where(table["setting"] == tuned, "*", "")
    return table
