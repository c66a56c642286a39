"""Every table of a campaign, computed from its results bundle alone (``mtl-cog report --bundle``).

No run folder is read: what a reader can recompute from a committed bundle is what we publish.
``bundle_tables`` returns the tables by name; ``write_bundle_report`` writes each as CSV and Markdown
plus ``report.md``; ``markdown_tables`` gives the Markdown that ``docs/`` embeds between
``<!-- bundle-table ... -->`` markers (``scripts/regenerate_docs_tables.py``; a test fails when a page
disagrees with its bundle).

- ``summary``: per data set, tuning draw and method, the test metrics' task mean, mean ± std over
  the final runs' seeds (the COG paper's Table 1 layout), with the seed count against the planned one
  (``planned_finals``) and a ``note`` (incomplete; a calibrator never exercised); final runs only (role
  ``final``): a sweep's or a curve's runs differ in their settings and have their own tables;
- ``paired``: each COG variant minus its counterpart (``campaign.json``'s ``counterparts``), paired
  by seed, 95 % t interval over seeds (``reporting/paired.py``), per draw;
- ``verdicts``: the planned draws' verdicts side by side: ``settled`` when every draw says the same,
  **depends on the tuning draw** when the draws disagree, ``incomplete`` while a draw lacks the pair or
  some of its planned seeds, *not tested at this budget* where the variant's calibrator stayed at the identity;
- ``chosen``: the chosen trial of every study (``trials.csv``), its searched ranges and the knobs chosen in
  the outer 5 % of them (``at_edge``, ``protocol.range_edges``); ``draw_choices``: per method, each draw's
  final choice (after any widening) side by side, the largest fold change of a knob between them, and
  ``changed`` where it exceeds ``CHANGED_FOLD`` (a factor of 2: every knob we tune is a positive rate,
  ratio or smoothing weight, searched on a log scale or over one decade);
- ``convergence``: per role, data set, draw and method: runs that settled under the convergence
  rule (``trajectories.convergence_of_curves``), and the calibrator's whole move;
- ``calibrators``: every learned calibrator's final values, distance from the identity and whole move;
  ``exercised`` is false where it stayed within 1 % of the identity (then the method was not tested at this
  budget, and the summary says so instead of ranking it);
- ``curve`` / ``curve_paired``: leader-rate curves where the bundle has ``curve`` runs;
- ``sweep_settings`` / ``sweep_paired``: a sweep's settings over its seeds, each against the grid's first
  (``reporting/sweep_report.py``);
- ``claims``: the COG paper's qualitative claims (``PAPER_CLAIMS``), each a paired comparison of final
  runs, marked per metric *supported* / *contradicted* / *inconclusive at this scale* when both draws
  agree, **depends on the tuning draw** when they do not, *not tested at this budget* where a learned
  calibrator stayed at the identity, *incomplete* while a side has no finished final runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.constants import IDENTITY_TOLERANCE, IDENTITY_VALUES
from mtl_cog.errors import UserError
from mtl_cog.experiments import protocol
from mtl_cog.io import atomic_write, atomic_write_text
from mtl_cog.reporting.bundle import TRIALS, Bundle, read_bundle, wide_scores
from mtl_cog.reporting.bundle_rows import CALIBRATOR_SPLIT
from mtl_cog.reporting.html_report import ReportTables, write_html_report
from mtl_cog.reporting.leader_curve import curve_table, paired_to_reference
from mtl_cog.reporting.paired import COUNTERPART, INCONCLUSIVE, PAIRED_METRICS, VARIANT, paired_differences
from mtl_cog.reporting.sweep_report import sweep_paired, sweep_settings
from mtl_cog.reporting.tables import markdown_table
from mtl_cog.reporting.trajectories import convergence_of_curves

SUMMARY_METRICS = ("accuracy", "nll", "brier", "ece@15")
SETTLED, DEPENDS = "settled", "depends on the tuning draw"


def _final_scores(bundle: Bundle) -> pd.DataFrame:
    runs = bundle.done()
    # final runs only: a curve's or a sweep's runs differ in their settings and must never be pooled in one mean
    finals = runs[runs["role"] == "final"]
    scores = wide_scores(bundle, finals)
    return scores[scores["split"] == "test"].assign(draw=lambda f: f["draw"].fillna("").astype(str))


def _trained(method: str) -> str:
    """The trained method behind a report method: ``baseline+ts`` is post-hoc TS fitted on ``baseline``'s runs."""
    return method.split("+", 1)[0]


def planned_finals(bundle: Bundle) -> pd.DataFrame:
    """Every *planned* final run as (data, method, draw, seed): what a complete campaign will have.

    ``campaign.json`` records each planned run's labels; a bundle written before it did (no ``labels``) is read
    from what exists: per data set, every method with a final run × every draw that has final runs or a tuning
    study × every seed that some final run has. A table then says ``incomplete`` while a (method, draw) has fewer
    seeds than planned, instead of reading the finished ones as the whole design.
    """
    labelled = [r["labels"] for r in bundle.campaign.get("specs", {}).values()
                if isinstance(r, dict) and isinstance(r.get("labels"), dict)]
    if labelled:
        frame = pd.DataFrame(labelled)
        frame = frame[frame["role"] == "final"]
        return (frame.assign(draw=frame["draw"].fillna("").astype(str), seed=frame["seed"].astype(int))
                [["data", "method", "draw", "seed"]].drop_duplicates().reset_index(drop=True))
    finals = bundle.runs[bundle.runs["role"] == "final"]
    draws = set(finals["draw"].fillna("").astype(str))
    if not bundle.trials.empty and "draw" in bundle.trials:
        draws |= {str(d) for d in bundle.trials["draw"].dropna()}
    rows = [{"data": data, "method": method, "draw": draw, "seed": int(seed)}
            for data, group in finals.groupby("data") for method in sorted(set(group["method"]))
            for draw in sorted(draws) for seed in sorted(set(group["seed"].astype(int)))]
    return pd.DataFrame(rows, columns=["data", "method", "draw", "seed"])


def _planned_seeds(planned: pd.DataFrame, data: str, method: str, draw: str) -> int:
    rows = planned[(planned["data"] == data) & (planned["method"] == _trained(method)) & (planned["draw"] == draw)]
    return int(rows["seed"].nunique())


def _planned_draws(planned: pd.DataFrame, data: str) -> list[str]:
    return sorted(set(planned.loc[planned["data"] == data, "draw"]))


def summary(bundle: Bundle, calibrator_table: pd.DataFrame | None = None) -> pd.DataFrame:
    scores = _final_scores(bundle)
    means = scores[scores["task"] == "mean"]
    planned = planned_finals(bundle)
    table = calibrators(bundle) if calibrator_table is None else calibrator_table
    rows = []
    for (data, draw, method), group in means.groupby(["data", "draw", "method"], sort=True):
        seeds = group["seed"].nunique()
        row = {"data": data, "draw": draw, "method": method, "seeds": seeds,
               "planned_seeds": max(_planned_seeds(planned, data, method, draw), seeds)}
        for metric in [m for m in SUMMARY_METRICS if m in group]:  # a metric the campaign did not record: no column
            values = group[metric].to_numpy(dtype=float)
            row[metric] = values.mean()
            row[f"{metric}_std"] = values.std(ddof=1) if len(values) > 1 else np.nan
        notes = []
        if seeds < row["planned_seeds"]:
            notes.append(f"incomplete: seeds {' '.join(map(str, sorted(group['seed'])))} of {row['planned_seeds']}")
        if _idle(table, data, method, draw):
            notes.append(f"{NOT_TESTED}: its calibrator stayed within {IDENTITY_TOLERANCE:.0%} of the identity")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows)


def summary_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``summary`` as the paper prints it: "mean ± std" per metric; seeds as "2 of 3" while some are missing."""
    out = table[["data", "draw", "method"]].copy()
    out["seeds"] = [str(n) if n >= planned else f"{n} of {planned}"
                    for n, planned in zip(table["seeds"], table["planned_seeds"])]
    for metric in [m for m in SUMMARY_METRICS if m in table]:
        out[metric] = [f"{m:.4f}" + ("" if pd.isna(s) else f" ± {s:.4f}") for m, s in
                       zip(table[metric], table[f"{metric}_std"])]
    out["note"] = table["note"]
    return out


def paired(bundle: Bundle) -> pd.DataFrame:
    scores = _final_scores(bundle)
    pairs = dict(bundle.campaign.get("counterparts", {}))
    frames = []
    for draw, group in scores.groupby("draw", sort=True):
        table = paired_differences(group.rename(columns={"data": "dataset"}), pairs, PAIRED_METRICS)
        frames.append(table.assign(draw=draw))
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    return table[["dataset", "draw", *[c for c in table.columns if c not in ("dataset", "draw")]]]


def _draw_gap(planned: pd.DataFrame, data: str, variant: str, counterpart: str, draw: str,
              n_seeds: float | None) -> str:
    """'' when the draw's pair holds every planned seed of both sides; else what it lacks ("draw 2: 1 of 3
    seeds", "draw 2 missing")."""
    want = min(_planned_seeds(planned, data, variant, draw), _planned_seeds(planned, data, counterpart, draw))
    if n_seeds is None:
        return f"draw {draw} missing" if draw else "missing"
    if want and np.isfinite(n_seeds) and int(n_seeds) < want:
        return f"{'draw ' + draw + ': ' if draw else ''}{int(n_seeds)} of {want} seeds"
    return ""


def verdicts(paired_table: pd.DataFrame, planned: pd.DataFrame | None = None,
             calibrator_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (data set, variant, counterpart, metric): each planned draw's verdict and whether they agree.

    ``answer`` is a draw's verdict when every planned draw gives the same (``status`` settled), **depends on the
    tuning draw** when they differ, ``incomplete (...)`` while a draw lacks the pair or some of its planned seeds,
    and *not tested at this budget* where the variant's learned calibrator stayed at the identity in a draw."""
    if paired_table.empty:
        return pd.DataFrame()
    planned = pd.DataFrame(columns=["data", "method", "draw", "seed"]) if planned is None else planned
    calibrator_table = pd.DataFrame() if calibrator_table is None else calibrator_table
    rows = []
    keys = ["dataset", "variant", "counterpart", "metric"]
    for key, group in paired_table.groupby(keys, sort=True):
        data, variant, counterpart, _ = key
        by_draw = {str(r.draw): r for r in group.itertuples()}
        draws = sorted(set(_planned_draws(planned, data))
                       | set(paired_table.loc[paired_table["dataset"] == data, "draw"].astype(str)))
        row, cells, gaps = dict(zip(keys, key)), [], []
        for draw in draws:
            found = by_draw.get(draw)
            seeds = None if found is None else float(getattr(found, "n_seeds", np.inf))
            gap = _draw_gap(planned, data, variant, counterpart, draw, seeds)
            cell = "" if found is None else str(found.better)
            if found is not None and _idle(calibrator_table, data, variant, draw):
                cell = f"{NOT_TESTED} ({cell})"
            if gap and found is not None:
                cell = f"{cell} ({gap})"
            row[f"draw {draw}" if draw else "verdict"] = cell
            cells.append(cell)
            if gap:
                gaps.append(gap)
        if gaps:
            row["answer"], row["status"] = f"incomplete ({', '.join(gaps)})", "incomplete"
        elif any(c.startswith(NOT_TESTED) for c in cells):
            row["answer"], row["status"] = NOT_TESTED, NOT_TESTED
        elif len(set(cells)) == 1:
            row["answer"], row["status"] = cells[0], SETTLED
        else:
            row["answer"], row["status"] = DEPENDS, DEPENDS
        rows.append(row)
    return pd.DataFrame(rows)


def _budget(bundle: Bundle) -> int | None:
    """The tuning budget the campaign recorded (None in a bundle written before the driver recorded it)."""
    budget = bundle.campaign.get("budget")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None


def chosen(bundle: Bundle) -> pd.DataFrame:
    """The chosen trial of every study that holds its whole budget of finished trials (one still tuning is left
    out: its best so far is no choice)."""
    trials = bundle.trials
    if trials.empty or "chosen" not in trials:
        return pd.DataFrame()
    counted = trials[trials["counted"].astype(str) == "True"] if "counted" in trials else trials
    finished = counted[counted["state"].isin(["complete", "pruned", "fail"])].groupby("study")["trial"].size()
    budget = _budget(bundle)
    if budget is None:  # a bundle written by tuning workers before the driver recorded its command
        waiting = set(counted.loc[counted["state"].isin(["running", "waiting"]), "study"])
        budget = int(finished.max()) if len(finished) else 0
        finished = finished[~finished.index.isin(waiting)]
    complete = set(finished[finished >= budget].index)
    picked = trials[(trials["chosen"] == "*") & trials["study"].isin(complete)].copy()
    keep = ["study", "draw", "trial", "overrides", "val_nll"]
    table = picked[[c for c in keep if c in picked]].copy()
    table["ranges"], table["at_edge"] = zip(*[_edges(row) for _, row in picked.iterrows()]) if len(picked) else ((), ())
    counts = counted.groupby("study").agg(trials=("trial", "size"),
                                          failed=("state", lambda s: int((s == "fail").sum())),
                                          pruned=("state", lambda s: int((s == "pruned").sum())))
    return table.merge(counts, left_on="study", right_index=True, how="left").sort_values("study")


def _edges(trial: pd.Series) -> tuple[str, str]:
    """(the study's searched ranges, the chosen knobs in the outer 5 % of theirs) from a trials.csv row; a bundle
    written before trials.csv recorded the ranges says so instead of reporting no edge."""
    text = trial.get("ranges")
    if not isinstance(text, str) or not text.strip():
        return "", "unknown (no ranges recorded)"
    try:
        knobs = protocol.parse_ranges(text)
    except ValueError as err:
        raise UserError(f"{TRIALS}: study {trial.get('study')}: {err}. Restore the bundle from git.") from None
    values = {k.key: float(trial[k.key]) for k in knobs if k.key in trial and pd.notna(trial[k.key])}
    return text, " ".join(protocol.range_edges(knobs, values))


CHANGED_FOLD = 2.0
STUDY_NAME = re.compile(r"^(?P<arm>.+?)(?:-d(?P<draw>\d+))?(?:-w(?P<widening>\d+))?$")


def _knobs(overrides: str) -> dict[str, float]:
    """``key=value key=value`` (trials.csv's ``overrides``) -> {key: value} of the numeric ones (a flag such as
    ``optim.allow_leader_lr_geq_follower=true``, which a leader ratio near 1 brings, is no knob)."""
    knobs = {}
    for key, _, value in (item.partition("=") for item in str(overrides).split() if "=" in item):
        try:
            knobs[key] = float(value)
        except ValueError:
            continue
    return knobs


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
            choices = [_knobs(draws[d][1]) for d in sorted(draws)]
            folds = [max(c[k] for c in choices) / min(c[k] for c in choices) for k in choices[0]
                     if all(k in c and c[k] > 0 for c in choices)]
            row["largest_fold"] = max(folds) if folds else np.nan
            row["changed"] = bool(folds) and max(folds) > CHANGED_FOLD
        rows.append(row)
    return pd.DataFrame(rows)


def convergence(bundle: Bundle) -> pd.DataFrame:
    runs = bundle.done()
    curves = bundle.curves
    rows = []
    for run in runs.itertuples():
        result = convergence_of_curves(curves[curves["run"] == run.run])
        rows.append({"role": run.role, "data": run.data, "draw": "" if pd.isna(run.draw) else str(run.draw),
                     "method": run.method, "run": run.run,
                     "converged": None if result is None else result.converged,
                     "calibrator_move": np.nan if result is None or result.calibrator_move is None
                     else float(result.calibrator_move),
                     "why_not": "" if result is None else result.why_not()})
    return pd.DataFrame(rows)


def convergence_counts(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    grouped = table.groupby(["role", "data", "draw", "method"], sort=True)
    return grouped.agg(runs=("run", "size"), converged=("converged", lambda c: int((c == True).sum())),  # noqa: E712
                       calibrator_move_max=("calibrator_move", "max")).reset_index()


def curves(bundle: Bundle) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(curve table, paired table) over every (data set, method) with leader-ratio runs in the bundle."""
    runs = bundle.done()
    curve_runs = runs[runs["role"] == "curve"]
    if curve_runs.empty:
        return pd.DataFrame(), pd.DataFrame()
    scores = wide_scores(bundle, curve_runs)
    scores = scores[scores["task"] != "mean"].rename(columns={"method": "arm"})
    tables, pairs = [], []
    counterparts = bundle.campaign.get("counterparts", {})
    for data, group in scores.groupby("data", sort=True):
        methods = sorted(set(group.loc[group["ratio"].notna(), "arm"]))
        tables.append(curve_table(group).assign(data=data))
        for method in methods:
            ratios = sorted(group.loc[(group["arm"] == method) & group["ratio"].notna(), "ratio"].unique())
            ref = counterparts.get(method, "baseline")
            pairs.append(paired_to_reference(group, method, ref, ratios).assign(data=data, method=method))
            below = [r for r in ratios if r < 1]
            pairs.append(paired_to_reference(group, method, method, below, reference_ratio=1.0)
                         .assign(data=data, method=method))
    return pd.concat(tables, ignore_index=True), pd.concat(pairs, ignore_index=True)


def calibrators(bundle: Bundle) -> pd.DataFrame:
    """Per run with a learned calibrator: its final values (min / median / max), the largest distance from the
    identity, the whole move over training, and whether it was exercised at all (moved >= 1 % from identity)."""
    runs = bundle.done()
    rows = bundle.results[(bundle.results["split"] == CALIBRATOR_SPLIT) & bundle.results["run"].isin(set(runs["run"]))]
    out = []
    labels = runs.set_index("run")
    for (run, parameter), group in rows.groupby(["run", "metric"], sort=True):
        values = group["value"].to_numpy(dtype=float)
        identity = IDENTITY_VALUES.get(parameter)
        distance = float(np.abs(values - identity).max()) if identity is not None else np.nan
        move = bundle.curves[(bundle.curves["run"] == run) & (bundle.curves["split"] == "calibrator")
                             & (bundle.curves["metric"] == "from_last")].sort_values("epoch")["value"]
        row = labels.loc[run]
        out.append({"data": row["data"], "draw": "" if pd.isna(row["draw"]) else str(row["draw"]),
                    "method": row["method"], "role": row["role"], "ratio": row["ratio"], "seed": row["seed"],
                    "parameter": parameter, "min": values.min(), "median": float(np.median(values)),
                    "max": values.max(), "from_identity": distance,
                    "whole_move": float(move.iloc[0]) if len(move) else np.nan,
                    "exercised": bool(distance >= IDENTITY_TOLERANCE) if identity is not None else True})
    return pd.DataFrame(out)


# The COG paper's qualitative claims that a campaign can check: (claim, variant, counterpart, the side the
# paper says wins). Its Tab. 22 (multi-task CelebA): "COG-FC and COG+LS consistently improve upon their
# counterparts, while COG-TS performs worse than Temperature Scaling"; Sec. 5: "Matrix Scaling [...]
# substantially worsens the performance of the Baseline" (calibrators overfit the calibration set).
PAPER_CLAIMS = (
    ("COG-FC improves on the baseline", "cog_fc", "baseline", VARIANT),
    ("COG+LS improves on label smoothing", "cog_ls", "ls", VARIANT),
    ("COG-TS is worse than post-hoc TS", "cog_ts", "baseline+ts", COUNTERPART),
    ("unregularised post-hoc MS worsens the baseline", "baseline+ms", "baseline", COUNTERPART),
)
CLAIM_METRICS = ("nll", "ece@15", "accuracy")
SUPPORTED, CONTRADICTED, NOT_DECIDED = "supported", "contradicted", "inconclusive at this scale"
NOT_TESTED = "not tested at this budget"


def _side(better: str, expected: str) -> str:
    """A paired verdict read against the paper's claim."""
    if better == INCONCLUSIVE:
        return NOT_DECIDED
    return SUPPORTED if better == expected else CONTRADICTED


def _idle(table: pd.DataFrame, data: str, method: str, draw: str) -> bool:
    """Whether every final run of (data, method, draw) with a learned calibrator left it at the identity."""
    if table.empty:
        return False
    learned = table[(table["data"] == data) & (table["method"] == method) & (table["role"] == "final")
                    & (table["draw"] == draw)]
    return not learned.empty and not learned["exercised"].any()


def claims(bundle: Bundle, calibrator_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (data set, claim, metric): each planned draw's reading of the paper's claim and the answer."""
    scores = _final_scores(bundle)
    if scores.empty:
        return pd.DataFrame()
    table = calibrators(bundle) if calibrator_table is None else calibrator_table
    planned = planned_finals(bundle)
    rows = []
    for data in sorted(scores["data"].unique()):
        draws = sorted(set(_planned_draws(planned, data)) | set(scores.loc[scores["data"] == data, "draw"]))
        for claim, variant, counterpart, expected in PAPER_CLAIMS:
            readings = {}
            for draw in draws:
                group = scores[(scores["data"] == data) & (scores["draw"] == draw)]
                pair = paired_differences(group.rename(columns={"data": "dataset"}), {variant: counterpart},
                                          CLAIM_METRICS)
                readings[draw] = {r.metric: r for r in pair.itertuples()}
            for metric in CLAIM_METRICS:
                row = {"data": data, "claim": claim, "pair": f"{variant} − {counterpart}", "metric": metric}
                sides, gaps = [], []
                for draw in draws:
                    r = readings[draw].get(metric)
                    gap = _draw_gap(planned, data, variant, counterpart, draw, None if r is None else float(r.n_seeds))
                    side, text = "", ""
                    if r is not None:
                        side = _side(r.better, expected)
                        interval = ("one seed: no interval" if pd.isna(r.ci_low)
                                    else f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]")
                        text = f"{side} ({r.mean_difference:+.4f} {interval})"
                        if _idle(table, data, variant, draw):  # its calibrator never left the identity
                            side, text = NOT_TESTED, f"{NOT_TESTED} ({text})"
                    if gap:
                        gaps.append(gap)
                        text = f"{text} ({gap})" if text else ""
                    row[f"draw {draw}" if draw else "reading"] = text
                    sides.append(side)
                if gaps:
                    row["answer"] = f"incomplete ({', '.join(gaps)})"
                elif NOT_TESTED in sides:
                    row["answer"] = NOT_TESTED
                else:
                    row["answer"] = sides[0] if len(set(sides)) == 1 else DEPENDS
                rows.append(row)
    return pd.DataFrame(rows)


TABLE_NAMES = ("summary", "summary_values", "paired", "verdicts", "claims", "chosen", "draw_choices", "convergence",
               "convergence_runs", "calibrators", "curve", "curve_paired", "sweep_settings", "sweep_paired")


def bundle_tables(bundle: Bundle) -> dict[str, pd.DataFrame]:
    """Every table of the campaign by name (``TABLE_NAMES``; empty tables left out)."""
    calibrator_table = calibrators(bundle)
    table = summary(bundle, calibrator_table)
    pair = paired(bundle)
    conv = convergence(bundle)
    curve, curve_pair = curves(bundle)
    chosen_table = chosen(bundle)
    tables = {"summary": summary_cells(table) if not table.empty else table, "summary_values": table,
              "paired": pair, "verdicts": verdicts(pair, planned_finals(bundle), calibrator_table),
              "claims": claims(bundle, calibrator_table),
              "chosen": chosen_table, "draw_choices": draw_choices(chosen_table),
              "convergence": convergence_counts(conv), "convergence_runs": conv,
              "calibrators": calibrator_table, "curve": curve, "curve_paired": curve_pair,
              "sweep_settings": sweep_settings(bundle), "sweep_paired": sweep_paired(bundle)}
    assert tuple(tables) == TABLE_NAMES
    return {name: frame for name, frame in tables.items() if not frame.empty}


def markdown_of(frame: pd.DataFrame) -> str:
    """A table as the docs show it: floats with 4 decimals (intervals and differences keep their sign)."""
    shown = frame.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = [("" if pd.isna(v) else f"{v:.4f}") for v in shown[column]]
        else:  # a cell with nothing to say (a draw without that study) is empty, never the word nan
            shown[column] = ["" if v is None or (isinstance(v, float) and pd.isna(v)) else v for v in shown[column]]
    return markdown_table(shown)


def _label(data: str, draw: str, draws: int) -> str:
    """A data set's section of report.html: one per tuning draw when there are several (never pooled)."""
    return data if draws <= 1 or not draw else f"{data} (draw {draw})"


def html_tables(bundle: Bundle, tables: dict[str, pd.DataFrame]) -> ReportTables:
    """``report.html``'s input from the bundle alone. The per-task panels show the task metrics; reliability
    diagrams need each prediction's bin, which a bundle does not keep (``compare`` over the run folders draws
    them)."""
    summary = tables.get("summary_values", pd.DataFrame())
    if summary.empty:
        return ReportTables(pd.DataFrame(columns=["dataset", "method", "n_seeds"]))
    draws = summary["draw"].nunique()
    label = lambda frame: [_label(d, str(w), draws) for d, w in zip(frame["data"], frame["draw"])]  # noqa: E731
    frame = summary.assign(dataset=label(summary)).rename(columns={"seeds": "n_seeds"})
    paired_table = tables.get("paired", pd.DataFrame())
    if not paired_table.empty:
        paired_table = paired_table.assign(dataset=[_label(d, str(w), draws) for d, w in
                                                    zip(paired_table["dataset"], paired_table["draw"])])
    scores = _final_scores(bundle)
    per_task = scores[scores["task"] != "mean"].assign(dataset=lambda f: label(f))
    per_task = per_task.groupby(["dataset", "method", "task"], sort=False)[
        [m for m in SUMMARY_METRICS if m in per_task]].mean().reset_index()
    runs = bundle.done()
    curves = bundle.curves[bundle.curves["split"] == "val"].merge(
        runs[["run", "data", "draw", "method", "seed", "role"]], on="run")
    curves = curves[curves["role"] == "final"].assign(dataset=lambda f: label(f))
    leader = tables.get("curve", pd.DataFrame())
    leader = leader.rename(columns={"data": "dataset"}) if not leader.empty else leader
    roles = runs["role"].value_counts()
    notes = [f"Computed from the results bundle of campaign {bundle.name} alone ("
             + ", ".join(f"{n} finished {role} runs" for role, n in roles.sort_index().items())
             + "); per-task reliability diagrams need the run folders (mtl-cog compare)."]
    conv = tables.get("convergence_runs", pd.DataFrame())
    unsettled = conv[conv["converged"] == False] if not conv.empty else conv  # noqa: E712
    sections = [
        ("Does each COG variant beat its counterpart? Both tuning draws", "Per draw: which side the 95 % paired t "
         "interval over seeds favours; answer 'settled' only when every draw agrees, 'depends on the tuning draw' "
         "otherwise, 'incomplete' while a draw lacks planned seeds.", tables.get("verdicts", pd.DataFrame())),
        ("The COG paper's claims at this scale", "Each claim as a paired comparison of final runs, per draw: "
         "supported / contradicted / inconclusive at this scale; 'not tested at this budget' where the learned "
         "calibrator stayed at the identity.", tables.get("claims", pd.DataFrame())),
        ("What the tuning chose", "Every study holding its whole budget: the chosen trial, the searched ranges, "
         "any chosen knob in the outer 5 % of its range (at_edge), failed and pruned trials.",
         tables.get("chosen", pd.DataFrame())),
        ("Do the two tuning draws choose alike?", "largest_fold: the largest ratio between the draws' values of "
         "one knob; changed: a factor above 2.", tables.get("draw_choices", pd.DataFrame())),
        ("Learned calibrators", "Final values over tasks, the largest distance from the identity, the whole move; "
         "exercised is false within 1 % of the identity.", tables.get("calibrators", pd.DataFrame())),
        ("Runs that did not settle", "By the convergence rule (best validation NLL still improving by more than "
         "1 %, or the calibrator making more than 10 % of its move, in the last 20 % of epochs).", unsettled),
    ]
    return ReportTables(frame, paired=paired_table, per_task=per_task, curves=curves, leader_curve=leader,
                        notes=notes, notes_title="About this report", sections=sections,
                        title=f"Campaign {bundle.name}")


def write_bundle_report(bundle: Bundle, out: Path, tables: dict[str, pd.DataFrame] | None = None) -> Path:
    """Each table as ``<name>.csv`` and ``<name>.md`` in ``out``, ``report.md`` with all of them, and
    ``report.html`` (``mtl_cog.reporting.html_report``)."""
    out.mkdir(parents=True, exist_ok=True)
    tables = bundle_tables(bundle) if tables is None else tables  # the caller's, when it computed them already
    for name in TABLE_NAMES:  # a table this bundle no longer has must not survive from an earlier report here
        if name not in tables:
            for suffix in (".csv", ".md"):
                (out / f"{name}{suffix}").unlink(missing_ok=True)
    if "summary_values" not in tables:
        (out / "report.html").unlink(missing_ok=True)
    counts = ", ".join(f"{n} {s}" for s, n in bundle.runs["status"].value_counts().sort_index().items())
    sections = [f"# Campaign {bundle.name}", "", f"{len(bundle.runs)} runs in the bundle"
                + (f" ({counts})" if counts else "") + "; every table below is computed from the bundle alone.", ""]
    for name, frame in tables.items():
        atomic_write(out / f"{name}.csv", lambda tmp, frame=frame: frame.to_csv(tmp, index=False))
        text = markdown_of(frame)
        atomic_write_text(out / f"{name}.md", text + "\n")
        if not name.endswith(("_runs", "_values")):
            sections += [f"## {name}", "", text, ""]
    atomic_write_text(out / "report.md", "\n".join(sections))
    if "summary_values" in tables:  # report.html is about finished final runs; a tuning in progress has none yet
        write_html_report(out / "report.html", html_tables(bundle, tables))
    return out / "report.md"


# ------------------------------------------------------------------------------------------ docs/ tables
# A results table in docs/ sits between these markers and is generated from a committed bundle:
#     <!-- bundle-table: results/<campaign>/bundle <table> [where <pandas query>] -->
#     ... the table, as markdown_of writes it ...
#     <!-- /bundle-table -->
# A block may name a table its bundle does not have *yet* (one of TABLE_NAMES whose runs have not finished: the
# summary before any final run, a curve before its lane ran): it reads PENDING until they exist, so a page can be
# laid out before its campaign ends and the lanes fill it in. A name no bundle can have is an error.
PENDING = "*Not in the bundle yet: the runs this table is made of have not finished.*"
MARKER = re.compile(r"<!-- bundle-table: (?P<bundle>\S+) (?P<table>\w+)(?: where (?P<query>.+?))? -->\n"
                    r"(?P<body>.*?)<!-- /bundle-table -->", re.DOTALL)


def _docs_pages(root: Path) -> list[Path]:
    return [p for p in sorted([*(root / "docs").rglob("*.md"), root / "README.md"]) if p.is_file()]


def pages_naming(root: Path, bundle: str) -> list[Path]:
    """The docs pages (and README) with a bundle-table block of ``bundle`` (as the markers name it)."""
    return [p for p in _docs_pages(root) if any(m["bundle"] == bundle for m in MARKER.finditer(p.read_text()))]


def regenerate_docs(root: Path, check: bool = False, only: str | None = None) -> list[str]:
    """Rewrite every bundle-table block under ``root/docs`` (and the README) from its bundle; with ``check``,
    write nothing; with ``only`` (a bundle as the markers name it), the blocks of that bundle alone.
    -> the blocks that disagreed with their bundle (``file: table``)."""
    stale, cache = [], {}
    for page in _docs_pages(root):
        text = page.read_text()

        def table_for(match: re.Match, page: Path = page) -> str:
            if only is not None and match["bundle"] != only:
                return match.group(0)
            path = root / match["bundle"]
            if path not in cache:
                bundle = read_bundle(path)
                if bundle is None:
                    raise UserError(f"{page}: bundle-table names {match['bundle']}, which holds no results bundle.")
                cache[path] = bundle_tables(bundle)
            tables = cache[path]
            if match["table"] not in TABLE_NAMES:
                raise UserError(f"{page}: bundle-table names no table {match['table']!r} "
                                f"(a bundle's tables: {', '.join(TABLE_NAMES)}).")
            frame = tables.get(match["table"], pd.DataFrame())
            if not frame.empty and match["query"]:
                frame = frame.query(match["query"])
            body = PENDING + "\n" if frame.empty else markdown_of(frame.reset_index(drop=True)) + "\n"
            if body != match["body"]:
                stale.append(f"{page.relative_to(root)}: {match['table']} of {match['bundle']}")
            head = match.group(0)[: match.start("body") - match.start(0)]
            return f"{head}{body}<!-- /bundle-table -->"

        new = MARKER.sub(table_for, text)
        if new != text and not check:
            atomic_write_text(page, new)
    return stale
