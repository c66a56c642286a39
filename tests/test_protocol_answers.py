"""The paper's claims under the paper protocol and the fair one side by side, with the share of the gain that
survives the fair protocol (``mtl_cog/analysis/protocol_answers.py``)."""

import math

import pandas as pd
import pytest
import test_bundle_answers as built  # the bundle builder of the answer tables' tests (baseline, cog_fc, cog_ts)

from mtl_cog.analysis.protocol_answers import protocol_claims, protocol_power, protocol_secondary
from mtl_cog.errors import UserError


def _bundle(monkeypatch, gains: dict):
    monkeypatch.setattr(built, "NLL_GAIN", gains)
    return built.make_bundle()


def test_the_surviving_share_is_the_fair_difference_over_the_papers(monkeypatch):
    paper = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    fair = _bundle(monkeypatch, {("cog_fc", "1"): 0.004, ("cog_fc", "2"): 0.006})
    table = protocol_claims({"paper": paper, "fair": fair}).set_index(["claim", "metric"])
    row = table.loc[("COG-FC improves on the baseline", "nll")]
    assert row["paper"] == row["fair"] == "supported"
    assert row["paper difference"] == pytest.approx(-0.02) and row["fair difference"] == pytest.approx(-0.005)
    assert row["surviving share"] == pytest.approx(0.25)
    assert row["paper ± (95 %)"] == pytest.approx(0.0, abs=1e-12)  # constant differences: a zero-width interval
    # where the paper protocol does not support a claim, no share is computed
    accuracy = table.loc[("COG-FC improves on the baseline", "accuracy")]
    assert accuracy["paper"] != "supported" and math.isnan(accuracy["surviving share"])


def test_a_claim_the_fair_protocol_reverses_has_a_negative_share(monkeypatch):
    paper = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    fair = _bundle(monkeypatch, {("cog_fc", d): -0.01 for d in ("1", "2")})
    row = protocol_claims({"paper": paper, "fair": fair}).set_index(["claim", "metric"]).loc[
        ("COG-FC improves on the baseline", "nll")]
    assert row["fair"] == "contradicted" and row["surviving share"] == pytest.approx(-0.5)


def test_one_protocol_alone_gives_its_answers_without_a_share(monkeypatch):
    table = protocol_claims({"fair": _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})})
    assert "surviving share" not in table and set(table["data"]) == {"d"}


def test_power_is_the_chance_the_rule_reads_supported_for_a_gain_the_size_of_post_hoc_ts(monkeypatch):
    """TS lowers the baseline's NLL by 0.004 in every run; the claims' differences are constant (zero spread: a
    TS-sized effect is read supported in every simulated draw) until one seed of cog_fc is made 0.05 worse, whose
    spread leaves a TS-sized gain almost never read supported in both draws. The campaign runs no COG+LS: H2 is
    left empty, not read."""
    narrow = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    row = protocol_power({"fair": [narrow]}).set_index(["protocol", "data", "metric"]).loc[("fair", "d", "nll")]
    assert row["ts gain"] == pytest.approx(0.004) and row["H1 P(supported)"] == 1.0
    assert math.isnan(row["H2 P(supported)"]) and row["H3 P(supported)"] == 1.0 and row["power note"] == ""
    wide = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    noisy = (wide.results["run"] == "d-cog_fc-seed1") & (wide.results["metric"] == "nll")
    wide.results.loc[noisy, "value"] += 0.05
    row = protocol_power({"fair": wide}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert row["H1 P(supported)"] < 0.05 and row["H3 P(supported)"] == 1.0


def test_a_data_set_in_two_bundles_of_one_protocol_is_refused(monkeypatch):
    bundle = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    with pytest.raises(UserError, match="data set d is in two of its bundles"):
        protocol_claims({"fair": [bundle, bundle]})


def test_the_secondary_readings_are_the_last_epoch_and_guos_ts_recipe(monkeypatch):
    """The last epoch's splits (``test@last``, ``test@last+ts``) read as the selected checkpoint's do; H3 against
    Guo's TS recipe pairs COG-TS with ``baseline+ts_guo``."""
    bundle = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    test = bundle.results[bundle.results["split"] == "test"]
    last = test.assign(split="test@last", value=lambda f: f["value"] + 0.05 * f["run"].str.contains("cog_fc"))
    guo = test[test["run"].str.contains("baseline")].assign(
        split="test+ts_guo", value=lambda f: f["value"] - 0.002 * (f["metric"] == "nll"))  # accuracy kept
    last_ts = last[last["run"].str.contains("baseline")].assign(split="test@last+ts")
    bundle.results = pd.concat([bundle.results, last, guo, last_ts], ignore_index=True)
    table = protocol_secondary({"fair": bundle}).set_index(["reading", "pair", "metric"])
    fc = table.loc[("last epoch", "cog_fc − baseline", "nll")]  # 0.02 better at the checkpoint, 0.03 worse at the end
    both = "1: counterpart (3 seeds), 2: counterpart (3 seeds)"
    assert fc["difference"] == pytest.approx(0.03) and fc["per draw"] == both
    assert ("last epoch", "cog_ts − baseline+ts", "nll") in table.index  # the last epoch's post-hoc TS
    h3 = table.loc[("Guo's TS recipe", "cog_ts − baseline+ts_guo", "nll")]
    assert h3["difference"] == pytest.approx(0.002) and h3["per draw"] == both


def test_power_waits_while_a_claim_pair_has_no_interval(monkeypatch):
    """cog_fc with a single seed per draw has no interval: H1's half-width is unknown (not read as narrow), H3's is
    read, provisionally; with no claim interval at all the reading waits."""
    bundle = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    keep = ~(bundle.runs["run"].str.contains("cog_fc") & bundle.runs["seed"].astype(int).isin([1, 2]))
    bundle.runs = bundle.runs[keep]
    row = protocol_power({"fair": bundle}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert math.isnan(row["H1 P(supported)"]) and row["H3 P(supported)"] == 1.0
    assert row["power note"] == "claims incomplete"
    single_ts = bundle.runs["run"].str.contains("cog_ts") & bundle.runs["seed"].astype(int).isin([1, 2])
    bundle.runs = bundle.runs[~single_ts]
    row = protocol_power({"fair": bundle}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert math.isnan(row["H1 P(supported)"]) and math.isnan(row["H3 P(supported)"])


def test_power_is_provisional_while_a_claim_lacks_planned_runs(monkeypatch):
    """cog_ts's draw 2 lacks seed 2: every pair still has an interval, but the H3 claim is incomplete, so the
    reading is marked as one that may change."""
    bundle = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")})
    keep = ~(bundle.runs["run"].str.contains("cog_ts") & (bundle.runs["draw"].astype(str) == "2")
             & (bundle.runs["seed"].astype(int) == 2))
    bundle.runs = bundle.runs[keep]
    row = protocol_power({"fair": bundle}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert row["H1 P(supported)"] == 1.0 and row["power note"] == "claims incomplete"


def test_a_share_is_of_a_claimed_gain_and_of_a_complete_fair_reading(monkeypatch):
    """H3 (COG-TS worse than TS) supported under both protocols: no share (it is not a gain). H1 supported by the
    paper protocol while the fair protocol still lacks draw 2 of COG-FC: no share until the fair reading is whole."""
    paper = _bundle(monkeypatch, {("cog_fc", d): 0.02 for d in ("1", "2")} | {("cog_ts", d): -0.01 for d in "12"})
    fair = _bundle(monkeypatch, {("cog_fc", d): 0.01 for d in ("1", "2")} | {("cog_ts", d): -0.01 for d in "12"})
    table = protocol_claims({"paper": paper, "fair": fair}).set_index(["claim", "metric"])
    ts = table.loc[("COG-TS is worse than post-hoc TS", "nll")]
    assert ts["paper"] == ts["fair"] == "supported" and math.isnan(ts["surviving share"])
    assert table.loc[("COG-FC improves on the baseline", "nll"), "surviving share"] == pytest.approx(0.5)
    fair.runs = fair.runs[~((fair.runs["method"] == "cog_fc") & (fair.runs["draw"] == "2"))]
    fc = protocol_claims({"paper": paper, "fair": fair}).set_index(["claim", "metric"]).loc[
        ("COG-FC improves on the baseline", "nll")]
    assert fc["fair"].startswith("incomplete") and math.isnan(fc["surviving share"])


def test_power_and_secondary_readings_made_of_part_of_the_design_say_so(monkeypatch):
    """A baseline seed still running: TS's gain is measured on part of the planned runs, so the power reading is
    provisional and names what is missing; a secondary reading's draw says 'incomplete', a draw not begun 'not
    run yet' (never a silent '2 seeds')."""
    monkeypatch.setattr(built, "NLL_GAIN", {("cog_fc", d): 0.02 for d in ("1", "2")})
    running = built.make_bundle(finished=lambda m, d, s: not (m == "baseline" and d == "2" and s == 2))
    row = protocol_power({"fair": running}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert row["power note"] == "claims incomplete; ts gain incomplete (draw 2: 2 of 3 seeds)"
    test = running.results[running.results["split"] == "test"]
    running.results = pd.concat([running.results, test.assign(split="test@last")], ignore_index=True)
    table = protocol_secondary({"fair": running}).set_index(["reading", "pair", "metric"])
    assert table.loc[("last epoch", "cog_fc − baseline", "nll"), "per draw"] == (
        "1: variant (3 seeds), 2: variant (2 of 3 seeds, incomplete)")
    begun = built.make_bundle(finished=lambda m, d, s: d == "1")
    test = begun.results[begun.results["split"] == "test"]
    begun.results = pd.concat([begun.results, test.assign(split="test@last")], ignore_index=True)
    table = protocol_secondary({"fair": begun}).set_index(["reading", "pair", "metric"])
    assert table.loc[("last epoch", "cog_fc − baseline", "nll"), "per draw"] == "1: variant (3 seeds), 2: not run yet"


def test_a_missing_baseline_draw_keeps_the_power_reading_provisional(monkeypatch):
    """TS's gain from one draw of two is no measure of the campaign's: 'ts gain incomplete (draw 2 missing)', also
    where no claim has an interval yet."""
    monkeypatch.setattr(built, "NLL_GAIN", {("cog_fc", d): 0.02 for d in ("1", "2")})
    half = built.make_bundle(finished=lambda m, d, s: not (m == "baseline" and d == "2"))
    row = protocol_power({"fair": half}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert row["power note"].endswith("ts gain incomplete (draw 2 missing)")
    lone = built.make_bundle(finished=lambda m, d, s: d == "1" and (m == "baseline" or s == 0))
    row = protocol_power({"fair": lone}).set_index(["data", "metric"]).loc[("d", "nll")]
    assert math.isnan(row["H1 P(supported)"]) and row["power note"].endswith("ts gain incomplete (draw 2 missing)")


def test_a_secondary_reading_against_reversed_predictions_says_so():
    """H3 against Guo's recipe where ts_guo reversed a task's predictions on seed 1: the draw's cell names it."""
    table = protocol_secondary({"fair": built.make_bundle(reversed_seed=1)}).set_index(["reading", "pair", "metric"])
    cell = table.loc[("Guo's TS recipe", "cog_ts − baseline+ts_guo", "nll"), "per draw"]
    note = "ts_guo changed predictions (a temperature keeps them unless negative): b (seed 1)"
    assert cell == f"1: counterpart (3 seeds; {note}), 2: counterpart (3 seeds; {note})"
