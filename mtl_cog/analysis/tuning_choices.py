"""What each tuning study chose: ``chosen`` (the chosen trial of every complete study, its searched ranges,
the knobs chosen at a range's edge, the study's trials by state, the epochs it trained and whether nothing competed
with its choice) and ``draw_choices`` (per method, each draw's final choice side by side and how far they differ).

Read from a results bundle's ``trials.csv`` alone; ``bundle_report.py`` publishes both tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.analysis.bundle_progress import STUDY_NAME, finished_counted_trials, spent_studies, tuning_budget
from mtl_cog.bundles.bundle import TRIALS, Bundle
from mtl_cog.config import search_ranges
from mtl_cog.errors import UserError


def chosen(bundle: Bundle) -> pd.DataFrame:
    """The chosen trial of every study that spent its budget (``bundle_progress.spent_studies``: its trials, or its
    epochs); one still tuning is left out: its best so far is no choice."""
    trials = bundle.trials
    if trials.empty or "chosen" not in trials:
        return pd.DataFrame()
    counted = trials[trials["counted"].astype(str) == "True"] if "counted" in trials else trials
    finished, budget, waiting = finished_counted_trials(trials), tuning_budget(bundle), set()
    if budget is None:  # a bundle written by tuning workers before the driver recorded its command
        waiting = set(counted.loc[counted["state"].isin(["running", "waiting"]), "study"])
        budget = int(finished.max()) if len(finished) else 0
    spent = spent_studies(trials, budget)  # a study that spent its epoch budget is complete with fewer trials
    complete = set(spent[spent].index) - waiting
    picked = trials[(trials["chosen"] == "*") & trials["study"].isin(complete)].copy()
    keep = ["study", "draw", "trial", "overrides", "val_nll"]
    table = picked[[c for c in keep if c in picked]].copy()
    table["ranges"], table["at_edge"] = zip(*[_edges(row) for _, row in picked.iterrows()]) if len(picked) else ((), ())
    counts = counted.groupby("study").agg(trials=("trial", "size"),
                                          failed=("state", lambda s: int((s == "fail").sum())),
                                          pruned=("state", lambda s: int((s == "pruned").sum())))
    # attempts stopped mid-run (a lane stopped) and run again: a later trial of the study names them in ``retry_of``
    # (the retry is the one counted); shown, so the stop stays visible. A failed extra trial is no retried one.
    counts["retried"] = _retried(trials).reindex(counts.index, fill_value=0).astype(int)
    if "epochs_trained" in counted:  # what the study cost: counted trials are no equal budget (tuning_rule.py)
        counts["epochs"] = pd.to_numeric(counted["epochs_trained"], errors="coerce").groupby(counted["study"]).sum()
    counts["unopposed"] = _unopposed(counted, picked).reindex(counts.index, fill_value=False)
    return table.merge(counts, left_on="study", right_index=True, how="left").sort_values("study")


def _unopposed(counted: pd.DataFrame, picked: pd.DataFrame) -> pd.Series:
    """Per study, whether its choice is its first counted trial and no other counted trial finished: a choice
    nothing competed with (the legacy halving rule promoted the first trial at every rung, ``halving.py``)."""
    out = {}
    for study, group in counted.groupby("study"):
        trials = pd.to_numeric(group["trial"], errors="coerce")
        choice = picked.loc[picked["study"] == study, "trial"]
        first = trials.min()
        others = group[trials != first]
        out[study] = bool(len(choice)) and int(choice.iloc[0]) == first and not (others["state"] == "complete").any()
    return pd.Series(out, dtype=bool)


def _retried(trials: pd.DataFrame) -> pd.Series:
    """Per study, how many of its trials a later trial retried (``retry_of``)."""
    if "retry_of" not in trials:
        return pd.Series(dtype=int)
    retried = pd.to_numeric(trials["retry_of"], errors="coerce")
    pairs = pd.DataFrame({"study": trials["study"], "trial": retried}).dropna().drop_duplicates()
    return pairs.groupby("study").size()


def _edges(trial: pd.Series) -> tuple[str, str]:
    """(the study's searched ranges, the chosen knobs in the outer 5 % of theirs) from a trials.csv row; a bundle
    written before trials.csv recorded the ranges says so instead of reporting no edge."""
    text = trial.get("ranges")
    if not isinstance(text, str) or not text.strip():
        return "", "unknown (no ranges recorded)"
    try:
        knobs = search_ranges.parse_ranges(text)
    except ValueError as err:
        raise UserError(f"{TRIALS}: study {trial.get('study')}: {err}. Restore the bundle from git.") from None
    values = {k.key: float(trial[k.key]) for k in knobs if k.key in trial and pd.notna(trial[k.key])}
    return text, " ".join(search_ranges.range_edges(knobs, values))


CHANGED_FOLD = 2.0


def draw_choices(chosen_table: pd.DataFrame) -> pd.DataFrame:
    """Per data set and method (``<data>-<method>``): each draw's final choice and how far the draws differ."""
    if chosen_table.empty:
        return pd.DataFrame()
    finals: dict[str, dict[str, tuple[int, str]]] = {}
    for study, overrides in zip(chosen_table["study"], chosen_table["overrides"]):
        match = STUDY_NAME.match(study)
        draw, widening = match["draw"] or "1", int(match["widening"] or 0)
        best = finals.setdefault(match["arm"], {}).get(draw)
        if best is None or widening > best[0]:  # a widened re-tuning replaces the choice at an edge
            finals[match["arm"]][draw] = (widening, overrides)
    rows = []
    for arm, draws in sorted(finals.items()):
        row = {"study": arm, **{f"draw {d}": draws[d][1] for d in sorted(draws)}}
        if len(draws) > 1:
            choices = [search_ranges.knob_values(draws[d][1]) for d in sorted(draws)]
            folds = [max(c[k] for c in choices) / min(c[k] for c in choices) for k in choices[0]
                     if all(k in c and c[k] > 0 for c in choices)]
            row["largest_fold"] = max(folds) if folds else np.nan
            row["changed"] = bool(folds) and max(folds) > CHANGED_FOLD
        rows.append(row)
    return pd.DataFrame(rows)
