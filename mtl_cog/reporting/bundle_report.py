"""Every table of a campaign, computed from its results bundle alone (``mtl-cog report --bundle``).

No run folder is read: what a reader can recompute from a committed bundle is what we publish.
``bundle_tables`` returns the tables by name (``TABLE_NAMES``); ``write_bundle_report`` writes each as CSV and
Markdown plus ``report.md`` and ``report.html``; ``reporting/docs_tables.py`` embeds them in ``docs/``.

- the answer tables, ``summary``, ``paired``, ``verdicts``, ``calibrators``, ``claims``: what the final runs say
  against what was planned (``analysis/bundle_answers.py``);
- ``chosen`` / ``draw_choices``: what each study chose and how the draws' choices differ
  (``analysis/tuning_choices.py``);
- ``convergence`` / ``scope``: per role, data set, draw and method, runs that settled under the convergence rule;
  per role and data set, what a headline from the bundle is scoped to (``analysis/bundle_scope.py``);
- ``curve`` / ``curve_paired``: leader-rate curves where the bundle has ``curve`` runs
  (``analysis/leader_curve.curves``);
- ``sweep_settings`` / ``sweep_paired``: a sweep's settings over its seeds, each against the grid's first
  (``analysis/sweep_report.py``);
- ``regime_gate``: is there miscalibration to remove (``analysis/regime_gate.py``); ``progress``: what ran of
  what the campaign planned, per data set and part (``analysis/bundle_progress.py``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mtl_cog.analysis.bundle_answers import (
    SUMMARY_METRICS,
    calibrators,
    claims,
    final_scores,
    paired,
    planned_finals,
    summary,
    summary_cells,
    verdicts,
)
from mtl_cog.analysis.bundle_progress import progress
from mtl_cog.analysis.bundle_scope import convergence, convergence_counts, scope
from mtl_cog.analysis.leader_curve import curves
from mtl_cog.analysis.regime_gate import regime_gate
from mtl_cog.analysis.sweep_report import sweep_paired, sweep_settings
from mtl_cog.analysis.tuning_choices import chosen, draw_choices
from mtl_cog.bundles.bundle import Bundle
from mtl_cog.bundles.bundle_reliability import diagram_bins
from mtl_cog.io import atomic_write, atomic_write_text
from mtl_cog.reporting.html_report import ALL_TASKS, ReportTables, write_html_report
from mtl_cog.reporting.tables import markdown_table

TABLE_NAMES = ("summary", "summary_values", "paired", "verdicts", "claims", "chosen", "draw_choices", "convergence",
               "convergence_runs", "scope", "calibrators", "curve", "curve_paired", "sweep_settings", "sweep_paired",
               "regime_gate", "progress")


def bundle_tables(bundle: Bundle) -> dict[str, pd.DataFrame]:
    """Every table of the campaign by name (``TABLE_NAMES``; empty tables left out)."""
    calibrator_table, planned = calibrators(bundle), planned_finals(bundle)  # each read once, used by three tables
    table = summary(bundle, calibrator_table, planned)
    pair = paired(bundle)
    conv = convergence(bundle)
    curve, curve_pair = curves(bundle)
    chosen_table = chosen(bundle)
    tables = {"summary": summary_cells(table) if not table.empty else table, "summary_values": table,
              "paired": pair, "verdicts": verdicts(pair, planned, calibrator_table, bundle),
              "claims": claims(bundle, calibrator_table, planned),
              "chosen": chosen_table, "draw_choices": draw_choices(chosen_table),
              "convergence": convergence_counts(conv), "convergence_runs": conv, "scope": scope(bundle, conv),
              "calibrators": calibrator_table, "curve": curve, "curve_paired": curve_pair,
              "sweep_settings": sweep_settings(bundle), "sweep_paired": sweep_paired(bundle),
              "regime_gate": regime_gate(bundle), "progress": progress(bundle)}
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


def _unsettled(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    conv = tables.get("convergence_runs", pd.DataFrame())
    return conv[conv["converged"] == False] if not conv.empty else conv  # noqa: E712


UNSETTLED_NOTE = ("By the convergence rule (best validation NLL still improving by more than 1 %, or the calibrator "
                  "making more than 10 % of its move, in the last 20 % of epochs).")
CALIBRATORS_NOTE = ("Final values over tasks, the largest distance from the identity (where COG starts them), the move "
                    "after epoch 1; exercised is false within 1 % of the identity.")


def _source_note(bundle: Bundle, tail: str) -> str:
    """The report's first line: the campaign and its finished runs by role, then ``tail``."""
    roles = bundle.done()["role"].value_counts()
    return (f"Computed from the results bundle of campaign {bundle.name} alone ("
            + ", ".join(f"{n} finished {role} runs" for role, n in roles.sort_index().items()) + f"){tail}")


def reliability_of_finals(bundle: Bundle, label) -> pd.DataFrame:
    """The final runs' test histograms (``reliability.csv.gz``) pooled over seeds per report data set, method and
    task (and every task pooled): the rows ``html_report`` draws reliability diagrams from."""
    finals = bundle.done()
    finals = finals[finals["role"] == "final"]
    rows = bundle.reliability[bundle.reliability["split"] == "test"].merge(
        finals[["run", "data", "draw", "method"]], on="run")
    if rows.empty:
        return pd.DataFrame()
    return diagram_bins(rows.assign(dataset=label(rows)), ["dataset", "method"], ALL_TASKS)


def _reliability_note(bundle: Bundle, reliability: pd.DataFrame, methods: pd.Series) -> str:
    """The report's one line on its reliability diagrams: where they come from, or why there are none."""
    if bundle.reliability.empty:
        return ("This bundle keeps no reliability histograms (collected before reliability.csv.gz existed): the "
                "per-task view shows the task metrics without diagrams; compare over the run folders draws them.")
    missing = sorted(set(methods) - set(reliability.get("method", [])))
    return ("Reliability diagrams from the bundle's test histograms (reliability.csv.gz, 20 bins, seeds pooled)"
            + (f"; none for {', '.join(missing)} (a bundle keeps the histogram of a run's own test predictions, "
               "not after a post-hoc calibrator)" if missing else "") + ".")


def html_tables(bundle: Bundle, tables: dict[str, pd.DataFrame]) -> ReportTables:
    """``report.html``'s input from the bundle alone; the per-task panels draw each method's reliability diagram
    from the bundle's histograms (``reliability.csv.gz``; a bundle from before it shows the task metrics alone)."""
    summary = tables.get("summary_values", pd.DataFrame())
    if summary.empty:
        if "curve" in tables:
            return curve_html_tables(bundle, tables)
        return ReportTables(pd.DataFrame(columns=["dataset", "method", "n_seeds"]))
    draws = summary["draw"].nunique()
    label = lambda frame: [_label(d, str(w), draws) for d, w in zip(frame["data"], frame["draw"])]  # noqa: E731
    frame = summary.assign(dataset=label(summary)).rename(columns={"seeds": "n_seeds"})
    paired_table = tables.get("paired", pd.DataFrame())
    if not paired_table.empty:
        paired_table = paired_table.assign(dataset=[_label(d, str(w), draws) for d, w in
                                                    zip(paired_table["dataset"], paired_table["draw"])])
    scores = final_scores(bundle)
    per_task = scores[scores["task"] != "mean"].assign(dataset=lambda f: label(f))
    per_task = per_task.groupby(["dataset", "method", "task"], sort=False)[
        [m for m in SUMMARY_METRICS if m in per_task]].mean().reset_index()
    runs = bundle.done()
    curves = bundle.curves[bundle.curves["split"] == "val"].merge(
        runs[["run", "data", "draw", "method", "seed", "role"]], on="run")
    curves = curves[curves["role"] == "final"].assign(dataset=lambda f: label(f))
    leader = tables.get("curve", pd.DataFrame())
    leader = leader.rename(columns={"data": "dataset"}) if not leader.empty else leader
    reliability = reliability_of_finals(bundle, label)
    notes = [_source_note(bundle, "."), _reliability_note(bundle, reliability, frame["method"])]
    unsettled = _unsettled(tables)
    sections = [
        ("Does each COG variant beat its counterpart? Both tuning draws", "Per draw: which side the 95 % paired t "
         "interval over seeds favours; answer 'settled' only when every draw agrees, 'depends on the tuning draw' "
         "otherwise, 'incomplete' while a draw lacks planned seeds.", tables.get("verdicts", pd.DataFrame())),
        ("The COG paper's claims at this scale", "Each claim as a paired comparison of final runs, per draw: "
         "supported / contradicted / inconclusive at this scale ('no interval (one seed)' where one seed is shared); "
         "'not tested at this budget' where the learned "
         "calibrator stayed at the identity.", tables.get("claims", pd.DataFrame())),
        ("What the tuning chose", "Every study holding its whole budget: the chosen trial, the searched ranges, "
         "any chosen knob in the outer 5 % of its range (at_edge), failed and pruned trials, and attempts stopped "
         "mid-run and retried (retried).",
         tables.get("chosen", pd.DataFrame())),
        ("Do the two tuning draws choose alike?", "largest_fold: the largest ratio between the draws' values of "
         "one knob; changed: a factor above 2.", tables.get("draw_choices", pd.DataFrame())),
        ("Learned calibrators", CALIBRATORS_NOTE, tables.get("calibrators", pd.DataFrame())),
        ("Runs that did not settle", UNSETTLED_NOTE, unsettled),
    ]
    return ReportTables(frame, paired=paired_table, per_task=per_task, reliability=reliability, curves=curves,
                        leader_curve=leader, notes=notes, notes_title="About this report", sections=sections,
                        title=f"Campaign {bundle.name}")


def curve_html_tables(bundle: Bundle, tables: dict[str, pd.DataFrame]) -> ReportTables:
    """``report.html`` of a leader-curve bundle, which has no final runs: one summary row per arm and ratio (the
    curve table's means over seeds: a curve's ratios are separate settings, never pooled), the curve figures,
    and the paired, scope, calibrator and convergence tables."""
    curve = tables["curve"]
    arms = curve.assign(method=[a if r in ("", None) or pd.isna(r) else f"{a} @ ratio {float(r):g}"
                                for a, r in zip(curve["arm"], curve["ratio"])])
    keys = ["data", "method"]
    summary = arms.pivot_table(index=keys, columns="metric", values="mean", sort=False).reset_index()
    summary = summary.merge(arms.groupby(keys, sort=False)["n_seeds"].min().reset_index(), on=keys)
    summary = summary.rename(columns={"data": "dataset"})
    notes = [_source_note(bundle, ". The summary gives each arm's test metrics (task mean), the mean over seeds; "
                               "the curves their 95 % intervals.")]
    sections = [
        ("Each ratio paired by seed", "The method at each ratio minus its reference, and minus itself at ratio 1 "
         "(no hierarchy; reference <method>@1), 95 % paired t interval over seeds; better names the side the "
         "interval excludes 0 for.", tables.get("curve_paired", pd.DataFrame())),
        ("Scope", "The runs, their split sizes, epochs, torch threads, how many converged, and the hours their "
         "epochs took.", tables.get("scope", pd.DataFrame())),
        ("Learned calibrators", CALIBRATORS_NOTE, tables.get("calibrators", pd.DataFrame())),
        ("Runs that did not settle", UNSETTLED_NOTE, _unsettled(tables)),
    ]
    return ReportTables(summary, leader_curve=curve.rename(columns={"data": "dataset"}), notes=notes,
                        notes_title="About this report", sections=sections, title=f"Campaign {bundle.name}")


def write_bundle_report(bundle: Bundle, out: Path, tables: dict[str, pd.DataFrame] | None = None) -> Path:
    """Each table as ``<name>.csv`` and ``<name>.md`` in ``out``, ``report.md`` with all of them, and
    ``report.html`` (``mtl_cog.reporting.html_report``)."""
    out.mkdir(parents=True, exist_ok=True)
    tables = bundle_tables(bundle) if tables is None else tables  # the caller's, when it computed them already
    for name in TABLE_NAMES:  # a table this bundle no longer has must not survive from an earlier report here
        if name not in tables:
            for suffix in (".csv", ".md"):
                (out / f"{name}{suffix}").unlink(missing_ok=True)
    has_html = "summary_values" in tables or "curve" in tables  # finished final runs, or a leader curve's
    if not has_html:
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
    if has_html:  # a tuning in progress has neither yet
        write_html_report(out / "report.html", html_tables(bundle, tables))
    return out / "report.md"
