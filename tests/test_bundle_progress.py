"""What ran of what a campaign planned, read from its bundle alone (``mtl_cog/analysis/bundle_progress.py``): a
study still tuning, final runs finished and failed, a whole campaign, two protocols side by side on a page."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import test_bundle_answers as built  # final runs of baseline, cog_fc, cog_ts in two draws, planned in campaign.json

from mtl_cog.analysis.bundle_progress import progress, protocol_progress
from mtl_cog.bundles import bundle as bundles
from mtl_cog.reporting.docs_tables import regenerate_docs


def _trials(study: str, states: list[str], counted: list[bool] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"trial": range(len(states)), "run": [f"trial_{i:02d}" for i in range(len(states))],
                         "state": states, "counted": counted or [True] * len(states)})


def _with_tuning(bundle: bundles.Bundle, studies: dict[str, pd.DataFrame], budget: int = 4) -> bundles.Bundle:
    """The studies' trials in trials.csv and their runs in runs.csv (named <study>-<run>, data set d)."""
    bundle.campaign["budget"] = budget
    for study, table in studies.items():
        bundle.set_trials(study, table)
        for run, state in zip(table["run"], table["state"]):
            if state not in ("complete", "pruned", "fail"):  # runs.csv holds finished runs only
                continue
            row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": f"{study}-{run}", "data": "d", "role": "trial",
                                                          "status": {"complete": "done", "fail": "failed"}[state]
                                                          if state != "pruned" else "pruned"}
            bundle.add_run(row, pd.DataFrame(columns=bundles.RESULT_COLUMNS),
                           pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    return bundle


def test_progress_counts_each_studys_finished_trials_and_the_planned_final_runs():
    """Two studies of budget 4: one whole (a counted failure spends the budget, an attempt a lane stop cut short and
    retried is not counted), one whose third trial is still running (not in runs.csv, still a begun study); final
    runs: one not finished, one failed."""
    bundle = built.make_bundle(finished=lambda m, d, s: not (m == "cog_fc" and d == "2" and s == 2))
    bundle = _with_tuning(bundle, {
        "d-cog_fc": _trials("d-cog_fc", ["complete", "fail", "fail", "complete", "pruned"],
                            [True, True, False, True, True]),
        "d-cog_ts": _trials("d-cog_ts", ["running", "waiting"])})
    failed = {c: "" for c in bundles.RUN_COLUMNS} | {"run": "d-cog_ts-d2-seed0", "data": "d", "role": "final",
                                                     "status": "failed"}
    bundle.add_run(failed, pd.DataFrame(columns=bundles.RESULT_COLUMNS), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    table = progress(bundle).set_index("part")
    tuning = table.loc["tuning (2 studies begun, 4 trials each)"]
    assert (tuning["planned"], tuning["done"], tuning["failed"], tuning["status"]) == (8, 4, 1, "running")
    final = table.loc["final"]
    assert (final["planned"], final["done"], final["failed"], final["status"]) == (18, 16, 1, "running")


def test_tuning_reads_complete_only_once_the_final_runs_are_planned():
    """Every begun study at its budget, but no final run planned yet: more studies may come (the bundle cannot
    know them), so it says so; with the finals planned (every study chose), complete."""
    whole = {"d-cog_fc": _trials("d-cog_fc", ["complete"] * 4)}
    assert set(progress(_with_tuning(built.make_bundle(), whole))["status"]) == {"complete"}
    early = _with_tuning(bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}}), whole)
    assert list(progress(early)["status"]) == ["begun studies at budget"]


def test_a_curve_campaign_counts_its_curve_runs():
    bundle = built.make_bundle()
    for record in bundle.campaign["specs"].values():
        record["labels"]["role"] = "curve"
    bundle.runs["role"] = "curve"
    row = progress(bundle).set_index("part").loc["curve"]
    assert (row["planned"], row["done"], row["status"]) == (18, 18, "complete")


def test_the_protocols_progress_block_fills_in_and_names_a_bundle_not_written(tmp_path: Path):
    bundles.write_bundle(tmp_path / "results/fair_d/bundle", built.make_bundle())
    page = tmp_path / "docs" / "r.md"
    page.parent.mkdir()
    page.write_text("<!-- bundle-protocols: progress paper=results/paper_d/bundle fair=results/fair_d/bundle -->\n"
                    "old\n<!-- /bundle-protocols -->\n")
    regenerate_docs(tmp_path)
    text = page.read_text()
    assert "| fair | d | final | 18 | 18 | 0 | complete |" in text
    assert "*Not written yet: paper (results/paper_d/bundle).*" in text
    assert protocol_progress({"paper": [], "fair": []}).empty


def test_a_study_that_spent_its_epoch_budget_is_complete_with_fewer_trials():
    """Under an epoch budget (``tuning_rule.py``) a study stops asking once its counted trials trained that many
    epochs: six trials of a budget of eight, 160 epochs spent, is a finished study (its choice is read), while one
    with epochs left and a trial still running is not. The legacy count alone would read it running forever."""
    from mtl_cog.analysis.tuning_choices import chosen

    spent = _trials("d-cog_fc", ["complete"] * 5 + ["pruned"]).assign(
        epochs_trained=[30] * 5 + [10], epoch_budget=160, chosen=["", "", "*", "", "", ""], overrides="x=1")
    running = _trials("d-cog_ts", ["complete", "running"]).assign(epochs_trained=[30, 0], epoch_budget=160,
                                                                   chosen=["*", ""], overrides="x=1")
    bundle = _with_tuning(built.make_bundle(), {"d-cog_fc": spent, "d-cog_ts": running}, budget=8)
    tuning = progress(bundle).set_index("part").loc["tuning (2 studies begun, 8 trials or 160 epochs each)"]
    assert (tuning["planned"], tuning["done"], tuning["status"]) == (6 + 8, 6 + 1, "running")
    assert list(chosen(bundle)["study"]) == ["d-cog_fc"]
    whole = _with_tuning(built.make_bundle(), {"d-cog_fc": spent}, budget=8)
    assert progress(whole).set_index("part").loc["tuning (1 studies begun, 8 trials or 160 epochs each)",
                                                  "status"] == "complete"
