"""How far a campaign is, from its bundle alone: what ran of what it planned, per data set and part.

A results page laid out before its campaign ends needs a "what ran, what is left" that cannot go stale between
two working sessions: ``progress`` reads it from the committed bundle (``campaign.json``, ``runs.csv``,
``trials.csv``), and a lane regenerates it with every commit like any other table. One row per data set and part:

- ``tuning``: the studies begun (a study not begun is unknown to the bundle, so the part names how many have) and
  their finished counted trials against the recorded budget per study (``campaign.json``'s ``budget``); a trial
  stopped by a lane stop and run again counts once; ``complete`` once the final runs are planned (every study has
  chosen), ``begun studies at budget`` before;
- ``final`` / ``curve`` / ``sweep``: the runs of that role that finished against those ``campaign.json`` plans
  (its specs' labels), and how many failed (a failed run is retried when the lane resumes);
- ``status``: ``complete`` when every planned run (every begun study's budget) finished, else ``running``.

``protocol_progress`` sets the bundles of several protocols side by side (the ``bundle-protocols: progress``
block of ``docs/results/overconfident.md``).
"""

from __future__ import annotations

import re

import pandas as pd

from mtl_cog.analysis.bundle_answers import planned_labels
from mtl_cog.bundles.bundle import Bundle

STUDY_NAME = re.compile(r"^(?P<arm>.+?)(?:-d(?P<draw>\d+))?(?:-w(?P<widening>\d+))?$")  # <data>-<method>[-dN][-wN]

ROLES = ("final", "curve", "sweep")  # the roles whose runs campaign.json plans before they run
COLUMNS = ["data", "part", "planned", "done", "failed", "status"]


def tuning_budget(bundle: Bundle) -> int | None:
    """The tuning budget the campaign recorded (None in a bundle written before the driver recorded it)."""
    budget = bundle.campaign.get("budget")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None


def finished_counted_trials(trials: pd.DataFrame) -> pd.Series:
    """Per study, its counted trials that finished (complete, pruned or failed: each spends the budget)."""
    counted = trials[trials["counted"].astype(str) == "True"] if "counted" in trials else trials
    return counted[counted["state"].isin(["complete", "pruned", "fail"])].groupby("study")["trial"].size()


def spent_studies(trials: pd.DataFrame, budget: int) -> pd.Series:
    """Per study, whether it spent its budget: ``budget`` finished counted trials, or, under an epoch budget
    (``tuning_rule.py``, recorded per trial in ``epoch_budget``), that many epochs trained by its counted trials with
    none still running: such a study asks no further trial, so it ends with fewer trials than the count."""
    counted = trials[trials["counted"].astype(str) == "True"] if "counted" in trials else trials
    finished = finished_counted_trials(trials)
    out = {}
    for study, group in counted.groupby("study"):
        cap = pd.to_numeric(group.get("epoch_budget", pd.Series(dtype=float)), errors="coerce").dropna()
        epochs = pd.to_numeric(group.get("epochs_trained", pd.Series(dtype=float)), errors="coerce").sum()
        idle = not group["state"].isin(["running", "waiting"]).any()
        out[study] = int(finished.get(study, 0)) >= budget or (len(cap) > 0 and idle and epochs >= cap.min())
    return pd.Series(out, dtype=bool)


def _planned_labels(bundle: Bundle) -> pd.DataFrame:
    labels = planned_labels(bundle)
    return pd.DataFrame(labels, columns=["data", "role"]) if labels else pd.DataFrame(columns=["data", "role"])


def _data_of(study: str, known: set[str]) -> str:
    """A study's data set: studies are named ``<data>-<method>[-d<draw>][-w<widening>]`` (``reproduce``); the
    longest data set of the campaign that prefixes it, else the name up to its method."""
    prefixes = [d for d in known if study.startswith(f"{d}-")]
    return max(prefixes, key=len) if prefixes else STUDY_NAME.match(study)["arm"].rsplit("-", 1)[0]


def _tuning_rows(bundle: Bundle, finals_planned: set[str]) -> list[dict]:
    """Per data set, the studies begun: every study in trials.csv, a trial still running included (runs.csv holds
    finished runs only). Whether more studies are to come the bundle does not say until the final runs are planned,
    which happens once every study has chosen: until then the status reads ``begun studies at budget``."""
    trials, budget = bundle.trials, tuning_budget(bundle)
    if trials.empty or "study" not in trials or budget is None:
        return []
    finished, spent = finished_counted_trials(trials), spent_studies(trials, budget)
    known = set(bundle.runs["data"].dropna().astype(str)) | set(_planned_labels(bundle)["data"].dropna())
    data_of = pd.Series({study: _data_of(study, known) for study in trials["study"].unique()})
    counted = trials[trials["counted"].astype(str) == "True"] if "counted" in trials else trials
    rows = []
    for data, studies in data_of.groupby(data_of):
        # a study's finished counted trials beyond its budget (an older widening) are shown as they are
        done = sum(int(finished.get(study, 0)) for study in studies.index)
        # a study that spent its epoch budget first planned the trials it ran (spent_studies)
        planned = sum(int(finished.get(study, 0)) if spent.get(study, False) else budget for study in studies.index)
        failed = int((counted["study"].isin(studies.index) & (counted["state"] == "fail")).sum())
        at_budget = all(spent.get(study, False) for study in studies.index)
        status = "running" if not at_budget else "complete" if data in finals_planned else "begun studies at budget"
        mine = counted[counted["study"].isin(studies.index)]
        caps = pd.to_numeric(mine["epoch_budget"], errors="coerce").dropna() if "epoch_budget" in mine else ()
        each = f"{budget} trials" + (f" or {int(min(caps))} epochs" if len(caps) else "")
        rows.append({"data": data, "part": f"tuning ({len(studies)} studies begun, {each} each)",
                     "planned": planned, "done": done, "failed": failed, "status": status})
    return rows


def progress(bundle: Bundle) -> pd.DataFrame:
    """One row per data set and part: planned, finished and failed runs and the status (module docstring)."""
    planned, runs = _planned_labels(bundle), bundle.runs
    rows = _tuning_rows(bundle, set(planned.loc[planned["role"] == "final", "data"]))
    for role in ROLES:
        for data, group in planned[planned["role"] == role].groupby("data"):
            mine = runs[(runs["role"] == role) & (runs["data"] == data)]
            done = int((mine["status"] == "done").sum())
            rows.append({"data": data, "part": role, "planned": len(group), "done": done,
                         "failed": int((mine["status"] == "failed").sum()),
                         "status": "complete" if done >= len(group) else "running"})
    return pd.DataFrame(rows, columns=COLUMNS)


def protocol_progress(bundles: dict[str, list[Bundle]]) -> pd.DataFrame:
    """``progress`` of each protocol's bundles, one table with the protocol first."""
    frames = [progress(b).assign(protocol=protocol) for protocol, given in bundles.items() for b in given]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    return table[["protocol", *COLUMNS]]
