"""The paper's tuning asymmetry alone: the fair bundle's COG runs against the paper bundle's untuned baseline,
paired by seed, with the refusals that keep two different studies from being paired
(``mtl_cog/analysis/protocol_asymmetry.py``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import test_bundle_answers as built  # final runs of baseline, cog_fc, cog_ts (draws 1, 2; seeds 0-2)
from test_protocol_markers import FAIR, PAPER, page, write

from mtl_cog.analysis.protocol_asymmetry import mixed_bundle, protocol_asymmetry
from mtl_cog.errors import UserError
from mtl_cog.reporting.docs_tables import regenerate_docs

# the paper's untuned baseline is 0.03 worse in NLL than the fair protocol's tuned one; the fair COG-FC gains 0.02
# over the tuned baseline; the paper bundle's own COG runs (stepped to a halt) are 0.1 worse than anything
PAPER_GAINS = {("baseline", d): -0.03 for d in ("1", "2")} | {(m, d): -0.1 for m in ("cog_fc", "cog_ts")
                                                                 for d in ("1", "2")}
FAIR_GAINS = {("cog_fc", d): 0.02 for d in ("1", "2")} | {("cog_ts", d): -0.01 for d in ("1", "2")}


def _bundles(monkeypatch, paper_gains=PAPER_GAINS, fair_gains=FAIR_GAINS):
    monkeypatch.setattr(built, "NLL_GAIN", paper_gains)
    paper = built.make_bundle()
    monkeypatch.setattr(built, "NLL_GAIN", fair_gains)
    return paper, built.make_bundle()


def _row(table: pd.DataFrame, claim: str, metric: str = "nll") -> pd.Series:
    return table.set_index(["claim", "metric"]).loc[(claim, metric)]


def test_tuned_cog_is_paired_with_the_untuned_baseline_and_the_papers_own_cog_runs_are_not_read(monkeypatch):
    paper, fair = _bundles(monkeypatch)
    table = protocol_asymmetry({"paper": [paper], "fair": [fair]})
    assert set(table["claim"]) == {"COG-FC improves on the baseline", "COG-TS is worse than post-hoc TS"}
    fc = _row(table, "COG-FC improves on the baseline")
    # fair COG-FC 0.28 against the paper's baseline 0.33: -0.05; against the fair (tuned) baseline 0.30: -0.02
    assert fc["answer"] == "supported" and fc["difference"] == pytest.approx(-0.05)
    assert fc["fair difference"] == pytest.approx(-0.02) and fc["surviving share"] == pytest.approx(0.4)
    assert fc["± (95 %)"] == pytest.approx(0.0, abs=1e-12)  # constant differences: a zero-width interval
    # fair COG-TS 0.31 against TS on the paper's baseline (0.33 - 0.004): COG-TS better, the claim contradicted
    ts = _row(table, "COG-TS is worse than post-hoc TS")
    assert ts["answer"] == "contradicted" and ts["difference"] == pytest.approx(-0.016)
    assert math.isnan(ts["surviving share"])  # shared only where the asymmetric reading supports the claim
    mixed = mixed_bundle(paper, fair, "d")
    assert set(mixed.runs["method"]) == {"baseline", "cog_fc", "cog_ts"}
    for run, source in (("d-cog_fc-seed0", fair), ("d-baseline-d2-seed1", paper)):  # each side's own rows
        pd.testing.assert_frame_equal(mixed.results[mixed.results["run"] == run].reset_index(drop=True),
                                      source.results[source.results["run"] == run].reset_index(drop=True))


def test_a_planned_draw_missing_on_either_side_reads_incomplete(monkeypatch):
    """Draw 1 alone says "supported"; a draw planned but not finished, on either side, leaves the answer open."""
    for sides in (("paper",), ("fair",), ("paper", "fair")):
        paper, fair = _bundles(monkeypatch)
        for side in sides:
            bundle = {"paper": paper, "fair": fair}[side]
            bundle.runs = bundle.runs[bundle.runs["draw"] != "2"]  # still planned in campaign.json, not run
        fc = _row(protocol_asymmetry({"paper": paper, "fair": fair}), "COG-FC improves on the baseline")
        assert fc["answer"] == "incomplete (draw 2 missing)", sides


def test_bundles_of_different_studies_are_not_paired(monkeypatch):
    paper, fair = _bundles(monkeypatch)
    fair.runs.loc[fair.runs["method"] == "cog_fc", "train_size"] = 5000
    with pytest.raises(UserError, match="different split sizes"):
        protocol_asymmetry({"paper": paper, "fair": fair})
    paper, fair = _bundles(monkeypatch)
    for spec in paper.campaign["specs"].values():  # the paper side plans draw 2 on seeds 5-7 instead of 0-2
        if spec["labels"]["method"] == "baseline" and spec["labels"]["draw"] == "2":
            spec["labels"] = {**spec["labels"], "seed": spec["labels"]["seed"] + 5}
    with pytest.raises(UserError, match="draw 2 plans different final seeds"):
        protocol_asymmetry({"paper": paper, "fair": fair})
    paper, fair = _bundles(monkeypatch)
    starts = pd.DataFrame({"trial": [0, 1], "optim.follower_lr": [8.2e-4, 8.2e-3], "leader_ratio": [0.56, 0.056],
                           "ranges": "optim.follower_lr=log[0.0001,0.01]", "retry_of": pd.NA, "draw": 1})
    paper.set_trials("d-cog_fc", starts)
    fair.set_trials("d-cog_fc", starts)
    protocol_asymmetry({"paper": paper, "fair": fair})  # the same start points: paired
    fair.set_trials("d-cog_fc", starts.assign(leader_ratio=[0.3, 0.056]))
    with pytest.raises(UserError, match="study d-cog_fc starts from different points"):
        protocol_asymmetry({"paper": paper, "fair": fair})


def _sized(bundle):
    bundle.runs[["train_size", "val_size", "test_size"]] = [2500, 4000, 8000]
    return bundle


def test_a_failed_run_and_a_second_data_set_do_not_block_the_pairing(monkeypatch):
    paper, fair = (_sized(b) for b in _bundles(monkeypatch))
    failed = fair.runs[fair.runs["method"] == "cog_fc"].iloc[[0]].assign(
        run="d-cog_fc-seed9", status="failed", train_size=float("nan"), val_size=float("nan"),
        test_size=float("nan"))
    other = fair.runs.iloc[[0]].assign(run="e-baseline-seed0", data="e", train_size=5000)
    fair.runs = pd.concat([fair.runs, failed, other], ignore_index=True)
    fc = _row(protocol_asymmetry({"paper": paper, "fair": fair}), "COG-FC improves on the baseline")
    assert fc["answer"] == "supported" and fc["difference"] == pytest.approx(-0.05)


def test_studies_tuned_differently_are_not_paired(monkeypatch):
    """A paper study with only its first trials recorded is still compared; different tuning seeds or a different
    command (beyond the protocol, the output folder, the plan and the parallelism) are refused."""
    paper, fair = _bundles(monkeypatch)
    starts = pd.DataFrame({"trial": range(8), "optim.follower_lr": [8.2e-4, 8.2e-3, 2.6e-3, 2.6e-4, 1e-3, 2e-3,
                                                                     3e-3, 4e-3],
                           "leader_ratio": 0.5, "ranges": "optim.follower_lr=log[0.0001,0.01]", "draw": 1})
    fair.set_trials("d-cog_fc", starts)
    paper.set_trials("d-cog_fc", starts.head(2).assign(**{"optim.follower_lr": [8.2e-4, 5e-3]}))
    with pytest.raises(UserError, match="study d-cog_fc starts from different points"):
        protocol_asymmetry({"paper": paper, "fair": fair})
    paper.set_trials("d-cog_fc", starts.head(2))
    paper.campaign["command"] = str(["scripts/reproduce.py", "--out", "<out>", "--protocol", "paper", "--budget",
                                     "8", "--jobs", "2", "--prune"])
    fair.campaign["command"] = str(["scripts/reproduce.py", "--out", "<out>", "--protocol", "fair", "--budget",
                                    "8", "--jobs", "1", "--prune", "--plan", "p.md"])
    protocol_asymmetry({"paper": paper, "fair": fair})  # the same design
    fair.campaign["command"] = fair.campaign["command"].replace("'8'", "'6'")
    with pytest.raises(UserError, match="commands differ beyond the protocol"):
        protocol_asymmetry({"paper": paper, "fair": fair})
    paper, fair = _bundles(monkeypatch)
    for bundle, seed in ((paper, 1000), (fair, 1234)):
        trial = bundle.runs[bundle.runs["method"] == "cog_fc"].iloc[[0]].assign(
            run=f"d-cog_fc-trial_00-seed{seed}", role="trial", seed=seed)
        bundle.runs = pd.concat([bundle.runs, trial], ignore_index=True)
    with pytest.raises(UserError, match="cog_fc study of draw 1 was tuned with different seeds"):
        protocol_asymmetry({"paper": paper, "fair": fair})


def test_no_share_for_h3_nor_while_the_fair_reading_is_incomplete(monkeypatch):
    paper, fair = _bundles(monkeypatch, fair_gains={("cog_fc", d): 0.02 for d in "12"}
                           | {("cog_ts", d): -0.05 for d in "12"})
    table = protocol_asymmetry({"paper": paper, "fair": fair})
    ts = _row(table, "COG-TS is worse than post-hoc TS")  # fair COG-TS 0.35 against 0.326: worse, supported
    assert ts["answer"] == "supported" and math.isnan(ts["surviving share"])
    fair.runs = fair.runs[~((fair.runs["method"] == "baseline") & (fair.runs["draw"] == "2"))]
    fc = _row(protocol_asymmetry({"paper": paper, "fair": fair}), "COG-FC improves on the baseline")
    assert fc["answer"] == "supported" and fc["fair"].startswith("incomplete") and math.isnan(fc["surviving share"])


def test_both_protocols_must_be_named(monkeypatch):
    paper, _ = _bundles(monkeypatch)
    with pytest.raises(UserError, match="name both paper= and fair="):
        protocol_asymmetry({"paper": [paper]})


def test_the_asymmetry_table_is_a_docs_block(tmp_path, monkeypatch):
    write(tmp_path, PAPER, PAPER_GAINS, monkeypatch)
    write(tmp_path, FAIR, FAIR_GAINS, monkeypatch)
    path = page(tmp_path, "asymmetry")
    regenerate_docs(tmp_path)
    row = next(line for line in path.read_text().splitlines() if "COG-FC improves on the baseline | nll" in line)
    assert row.startswith("| d | COG-FC improves on the baseline | nll | supported | -0.0500 |")
    assert row.endswith("| -0.0200 | 0.4000 |") and regenerate_docs(tmp_path, check=True) == []
