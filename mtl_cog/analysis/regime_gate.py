"""Is there miscalibration for a method to remove? The regime gate of a sweep or of a campaign's final baselines.

A comparison of calibration methods can only find a gain where there is miscalibration to remove. The gate of
``docs/results/overconfident-plan.md`` asks of a configuration (the baseline, mean over tasks, over >= 3 seeds):

1. test ECE@15 at least ``GATE_ECE`` (0.03), and
2. post-hoc temperature scaling, fitted on the run's validation split, lowers the test NLL by at least
   ``GATE_TS_GAIN`` (5 %) relative, with a 95 % t interval over seeds (of the per-seed relative change) that
   excludes 0. A seed's relative change is of its *task-mean* NLLs, ``(nll+ts − nll) / nll``, not the mean of
   per-task changes, which on the mosaic is far larger: its tasks with a small NLL change most in relative
   terms while adding little to the task mean the claims are read on.

Neither criterion has a sign: an underfit, *under*confident baseline passes too (the paper protocol's Adam 1e-4
on the mosaic does). ``confidence − accuracy`` gives it (> 0 overconfident), at the selected checkpoint, from the
bundle's reliability bins (``bundle_reliability.confidence_gaps``); a bundle without bins has no such column.

``regime_gate`` reads it per sweep setting (``sweep_report.setting_labels``: the grid's values) of a pilot's
sweep, or, in a campaign's bundle (no sweep runs), per data set and tuning draw of its final ``baseline`` runs:
the gate re-measured on the tuned (or, under the paper protocol, fixed) baseline the claims are paired with,
on the campaign's own seeds (a pass is read once every planned seed is in). Per checkpoint rule: the *selected*
checkpoint (best validation Brier, the paper's: results splits ``val``, ``test``, ``test+ts``) and the *last* epoch
(``eval.score_last_epoch``: ``val@last``, ``test@last``, ``test@last+ts``).
``val_nll`` is the validation NLL of the same checkpoint, what a tuning would choose the setting by: the *tuned*
baseline is the setting with the lowest one. Only what the bundle holds is read; a setting without the splits
(a sweep run without ``--posthoc ts`` or without the last epoch scored) gets an empty row for that rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.analysis.bundle_answers import planned_finals
from mtl_cog.analysis.paired import seed_t_interval
from mtl_cog.analysis.sweep_report import _planned, setting_labels
from mtl_cog.bundles.bundle import Bundle
from mtl_cog.bundles.bundle_reliability import confidence_gaps

GATE_ECE = 0.03
GATE_TS_GAIN = 0.05
GATE_SEEDS = 3  # the fewest seeds the gate is read on
GAP = "confidence − accuracy"  # > 0 overconfident, < 0 underconfident (selected checkpoint, task mean)
RULES = {"best validation Brier": "", "last epoch": "@last"}  # checkpoint rule -> the tag of its results splits


def _task_means(bundle: Bundle, runs: list[str]) -> pd.DataFrame:
    """run x (split, metric) of the task means, and ``(test, confidence − accuracy)``: the task mean of the
    selected checkpoint's mean confidence minus accuracy (``bundle_reliability.confidence_gaps``), NaN where a task's
    bins cannot say (or the bundle keeps none: a sweep's)."""
    results = bundle.results
    means = results[(results["task"] == "mean") & results["run"].isin(runs)]
    wide = means.pivot_table(index="run", columns=["split", "metric"], values="value", aggfunc="first")
    bins = bundle.reliability[(bundle.reliability["split"] == "test") & bundle.reliability["run"].isin(runs)]
    accuracy = results[(results["split"] == "test") & (results["metric"] == "accuracy")].set_index(["run", "task"])
    gaps = confidence_gaps(bins, accuracy["value"]) if len(bins) else pd.Series(dtype=float)
    per_run = gaps.groupby(level="run").mean().where(gaps.isna().groupby(level="run").sum() == 0) if len(gaps) \
        else pd.Series(dtype=float)
    wide[("test", GAP)] = per_run.reindex(wide.index)
    return wide


def _gate_row(wide: pd.DataFrame, runs: list[str], planned_seeds: int, setting: str, rule: str, tag: str) -> dict:
    """One setting's gate under one checkpoint rule (``tag``: the results splits' suffix) from its runs' task means."""
    needed = [(f"val{tag}", "nll"), (f"test{tag}", "ece@15"), (f"test{tag}", "nll"), (f"test{tag}+ts", "nll")]
    have = [r for r in runs if r in wide.index and all(c in wide.columns and np.isfinite(wide.at[r, c])
                                                       for c in needed)]
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
                    # the sign ECE lacks, where every run's bins say it (the selected checkpoint's alone)
                    GAP: float(cells[("test", GAP)].mean()) if not tag and cells[("test", GAP)].notna().all()
                    else np.nan,
                    # read on every planned seed (>= 3) or not at all: a pass on part of the seeds could turn
                    "passes": bool(ece >= GATE_ECE and mean <= -GATE_TS_GAIN and high < 0)
                    if len(have) >= max(planned_seeds, GATE_SEEDS) else None})
    notes = []
    unread = int(wide.loc[have, ("test", GAP)].isna().sum()) if have and not tag else 0
    if unread and wide[("test", GAP)].notna().any():  # bins elsewhere in the bundle: these runs' cannot be read
        notes.append(f"confidence − accuracy: {unread} run(s) whose bins do not reproduce their accuracy")
    if len(have) < len(runs):  # a finished run without every value the gate reads: said, not hidden
        notes.append(f"{len(runs) - len(have)} finished run(s) lack a value the gate reads")
    if runs and len(runs) < planned_seeds:
        notes.append(f"incomplete: read once all {planned_seeds} seeds are in")
    if planned_seeds < GATE_SEEDS:
        notes.append(f"{planned_seeds} seed(s) planned: the gate reads {GATE_SEEDS} or more")
    if notes:
        row["note"] = "; ".join(notes)
    return row


def regime_gate(bundle: Bundle) -> pd.DataFrame:
    """One row per sweep setting (or final baseline per data set and draw) and checkpoint rule: seeds, val NLL,
    test ECE@15, TS's relative NLL change with its 95 % interval, and whether the gate passes (module docstring)."""
    done = bundle.done()
    if done.empty:
        return pd.DataFrame()
    if not (done["role"] == "sweep").any():
        return _final_baseline_gate(bundle, done)
    planned = _planned(bundle)
    labels = setting_labels(planned)
    setting_of = dict(zip(planned["run"], planned["setting"].map(labels)))
    done = done[done["run"].isin(setting_of) & (done["role"] == "sweep")]  # a sweep's runs: a grid of settings
    if done.empty:
        return pd.DataFrame()
    wide = _task_means(bundle, list(done["run"]))
    rows = []
    for setting in dict.fromkeys(planned["setting"].map(labels)):
        runs = [r for r in done["run"] if setting_of[r] == setting]
        planned_seeds = int((planned["setting"].map(labels) == setting).sum())
        rows += [_gate_row(wide, runs, planned_seeds, setting, rule, tag) for rule, tag in RULES.items()]
    table = _gap_where_known(pd.DataFrame(rows), wide)
    complete = all(str(s).split(" of ")[0] == str(s).split(" of ")[1] for s in table["seeds"])
    if "val_nll" in table and complete:  # the tuned baseline: the lowest validation NLL once every setting finished
        selected = table[table["rule"] == next(iter(RULES))]
        tuned = selected.loc[selected["val_nll"].idxmin(), "setting"] if selected["val_nll"].notna().any() else None
        table["tuned"] = np.where(table["setting"] == tuned, "*", "")
    return table


def _follower_rate(bundle: Bundle, runs: list[str]) -> str:
    """The baseline's rate as its specs record it (one value per draw: the tuned or the fixed one), '' if none."""
    specs = bundle.campaign.get("specs", {})
    rates = {item for run in runs if isinstance(specs.get(run), dict)  # an older bundle's spec: a digest alone
             for item in specs[run].get("overrides", []) if item.startswith("optim.follower_lr=")}
    return ", ".join(sorted(rates))


def _final_baseline_gate(bundle: Bundle, done: pd.DataFrame) -> pd.DataFrame:
    """The gate per data set and draw of a campaign's final ``baseline`` runs (the seeds it planned, from
    ``planned_finals``); empty where the campaign has no baseline."""
    planned = planned_finals(bundle)
    planned = planned[planned["method"] == "baseline"]
    finals = done[(done["role"] == "final") & (done["method"] == "baseline")].assign(
        draw=lambda f: f["draw"].fillna("").astype(str))
    if planned.empty or finals.empty:
        return pd.DataFrame()
    wide = _task_means(bundle, list(finals["run"]))
    rows = []
    for (data, draw), seeds in planned.groupby(["data", "draw"], sort=True):
        runs = list(finals[(finals["data"] == data) & (finals["draw"] == draw)]["run"])
        rate = _follower_rate(bundle, runs)
        setting = f"{data}, baseline" + (f", draw {draw}" if draw else "") + (f" ({rate})" if rate else "")
        rows += [_gate_row(wide, runs, seeds["seed"].nunique(), setting, rule, tag) for rule, tag in RULES.items()]
    return _gap_where_known(pd.DataFrame(rows), wide)


def _gap_where_known(table: pd.DataFrame, wide: pd.DataFrame) -> pd.DataFrame:
    """The table without the confidence − accuracy column where no run's bins give one (a bundle without bins)."""
    return table.drop(columns=GAP) if GAP in table and wide[("test", GAP)].isna().all() else table
