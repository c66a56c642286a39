"""The answer tables of a results bundle while its campaign is still running, and once it is done: a draw or seed
that is planned but not finished makes every reading 'incomplete' (never a settled verdict on part of the design);
a learned calibrator left at the identity is not ranked; chosen knobs at a range edge are flagged from the ranges
trials.csv records; report.html shows the answers; a rerun into the same folder leaves no stale table."""

import pandas as pd
import pytest

from mtl_cog.analysis.bundle_answers import DEPENDS, NOT_TESTED, SETTLED
from mtl_cog.bundles import bundle as bundles
from mtl_cog.config import search_ranges
from mtl_cog.experiments import campaign
from mtl_cog.reporting.bundle_report import bundle_tables, write_bundle_report

SEEDS = (0, 1, 2)
# (method, draw) -> how much lower the test NLL is than the baseline's (every seed and task)
NLL_GAIN = {("cog_fc", "1"): 0.02, ("cog_fc", "2"): 0.02, ("cog_ts", "1"): -0.01, ("cog_ts", "2"): -0.01}


def make_bundle(finished=lambda method, draw, seed: True, idle_draw: str | None = None,
                reversed_seed: int | None = None) -> bundles.Bundle:
    """Final runs of baseline, cog_fc, cog_ts (draws 1, 2; seeds 0-2; tasks a, b), each planned in campaign.json
    with its labels; ``finished`` says which have finished; cog_ts's temperature stays at 1 in ``idle_draw``;
    post-hoc ``ts_guo`` on the baseline reverses task b's predictions (accuracy 1 - a) on ``reversed_seed``."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {},
                             "counterparts": {"cog_fc": "baseline", "cog_ts": "baseline+ts"}})
    for method in ("baseline", "cog_fc", "cog_ts"):
        for draw in ("1", "2"):
            for seed in SEEDS:
                run = campaign.run_name(data="d", method=method, draw=int(draw), seed=seed)
                labels = campaign.Labels("d", method, "final", seed, draw)
                bundle.campaign["specs"][run] = {"digest": run, "setting": f"{method}-{draw}", "labels": labels.row()}
                if not finished(method, draw, seed):
                    continue
                row = {c: "" for c in bundles.RUN_COLUMNS} | {**labels.row(), "run": run, "campaign": "c",
                                                              "status": "done", "config_digest": run}
                nll = 0.3 - NLL_GAIN.get((method, draw), 0.0) + 0.003 * seed
                results = [{"run": run, "split": "test", "task": task, "metric": metric, "value": value + 0.01 * i}
                           for i, task in enumerate(("a", "b"))
                           for metric, value in (("nll", nll), ("accuracy", 0.9 + 0.001 * seed))]
                if method == "baseline":  # post-hoc TS on it: NLL 0.004 lower
                    results += [{**r, "split": "test+ts", "value": r["value"] - 0.004 * (r["metric"] == "nll")}
                                for r in list(results)]
                    results += [{**r, "split": "test+ts_guo", "value": 1 - r["value"]
                                 if (seed, r["task"], r["metric"]) == (reversed_seed, "b", "accuracy") else r["value"]}
                                for r in list(results) if r["split"] == "test" and reversed_seed is not None]
                if method == "cog_ts":
                    results += [{"run": run, "split": "calibrator", "task": task, "metric": "temperature",
                                 "value": 1.0 if draw == idle_draw else 1.4} for task in ("a", "b")]
                means = pd.DataFrame(results).query("split != 'calibrator'").groupby(
                    ["run", "split", "metric"], as_index=False)["value"].mean().assign(task="mean")
                bundle.add_run(row, pd.concat([pd.DataFrame(results), means]),
                               pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    return bundle


def _verdict(tables, variant, metric="nll"):
    return tables["verdicts"].set_index(["variant", "metric"]).loc[(variant, metric)]


def test_a_complete_campaign_reads_settled_and_an_idle_calibrator_is_not_ranked():
    tables = bundle_tables(make_bundle(idle_draw="2"))
    fc = _verdict(tables, "cog_fc")
    assert fc["draw 1"] == fc["draw 2"] == fc["answer"] == "variant" and fc["status"] == SETTLED
    ts = _verdict(tables, "cog_ts")  # COG-TS worse than TS in both draws, but draw 2 never left T = 1
    assert ts["draw 1"] == "counterpart" and ts["draw 2"].startswith(NOT_TESTED) and ts["answer"] == NOT_TESTED
    summary = tables["summary"].set_index(["draw", "method"])
    assert summary.loc[("2", "cog_ts"), "note"].startswith(NOT_TESTED) and summary.loc[("1", "cog_ts"), "note"] == ""
    assert summary.loc[("1", "cog_fc"), "seeds"] == "3"


def test_a_posthoc_temperature_that_changed_an_accuracy_is_named_as_reversed_predictions():
    """Temperature scaling keeps every prediction, so a changed accuracy means a negative temperature (Guo et al.'s
    recipe as published can end there): the summary row names the task and seed, not a silently worse mean; one
    prediction of 8,000 changed is enough; a method that may change predictions (vector scaling) is not flagged."""
    summary = bundle_tables(make_bundle(reversed_seed=1))["summary"].set_index(["draw", "method"])
    for draw in ("1", "2"):
        assert summary.loc[(draw, "baseline+ts_guo"), "note"] == (
            "ts_guo changed predictions (a temperature keeps them unless negative): b (seed 1)")
        assert summary.loc[(draw, "baseline+ts"), "note"] == ""  # same accuracy: nothing to say
    clean = bundle_tables(make_bundle(reversed_seed=-1))["summary"].set_index(["draw", "method"])
    assert clean.loc[("1", "baseline+ts_guo"), "note"] == ""  # the same accuracies: nothing to say
    bundle = make_bundle(reversed_seed=-1)
    results = bundle.results
    one = (results["split"] == "test+ts_guo") & (results["metric"] == "accuracy") & (results["task"] == "a") & \
        results["run"].str.endswith("-seed2")
    results.loc[one, "value"] += 1 / 8000
    baseline_test = results[(results["split"] == "test") & results["run"].str.contains("baseline")]
    bundle.results = pd.concat([results, baseline_test.assign(split="test+vs", value=lambda f: f["value"] / 2)])
    summary = bundle_tables(bundle)["summary"].set_index(["draw", "method"])
    assert summary.loc[("1", "baseline+ts_guo"), "note"].endswith(": a (seed 2)")
    assert summary.loc[("1", "baseline+vs"), "note"] == ""  # vector scaling may change predictions


def test_a_draw_with_a_seed_still_running_is_incomplete_everywhere():
    tables = bundle_tables(make_bundle(finished=lambda m, d, s: not (m == "cog_fc" and d == "2" and s == 2)))
    fc = _verdict(tables, "cog_fc")
    assert fc["status"] == "incomplete" and fc["answer"] == "incomplete (draw 2: 2 of 3 seeds)"
    claim = tables["claims"].set_index(["claim", "metric"]).loc[("COG-FC improves on the baseline", "nll")]
    assert claim["answer"] == "incomplete (draw 2: 2 of 3 seeds)" and claim["draw 1"].startswith("supported")
    summary = tables["summary"].set_index(["draw", "method"])
    assert summary.loc[("2", "cog_fc"), "seeds"] == "2 of 3" and "incomplete" in summary.loc[("2", "cog_fc"), "note"]
    assert _verdict(tables, "cog_ts")["status"] == SETTLED  # the other pairs are whole


def test_a_draw_not_started_is_incomplete_not_an_answer():
    tables = bundle_tables(make_bundle(finished=lambda m, d, s: d == "1"))
    for variant in ("cog_fc", "cog_ts"):
        assert _verdict(tables, variant)["answer"] == "incomplete (draw 2 missing)"
    claims = tables["claims"].query("metric == 'nll'").set_index("claim")["answer"]
    assert set(claims[["COG-FC improves on the baseline", "COG-TS is worse than post-hoc TS"]]) == {
        "incomplete (draw 2 missing)"}
    assert claims["COG+LS improves on label smoothing"] == "incomplete (draw 1 missing, draw 2 missing)"


def test_a_draw_with_one_seed_has_no_interval_and_no_reading():
    """One shared seed gives a difference but no interval: the draw reads 'no interval', never 'inconclusive' (an
    interval that straddles 0), and the summary names the seed that finished."""
    tables = bundle_tables(make_bundle(finished=lambda m, d, s: d == "1" and (m != "cog_fc" or s == 2)))
    claim = tables["claims"].set_index(["claim", "metric"]).loc[("COG-FC improves on the baseline", "nll")]
    assert claim["draw 1"] == "no interval (one seed) (-0.0200) (draw 1: 1 of 3 seeds)"
    assert claim["answer"] == "incomplete (draw 1: 1 of 3 seeds, draw 2 missing)"
    note = tables["summary"].set_index(["draw", "method"]).loc[("1", "cog_fc"), "note"]
    assert note == "incomplete: 1 of 3 seeds (2)"
    assert _verdict(tables, "cog_fc")["draw 1"] == "no interval (one seed) (draw 1: 1 of 3 seeds)"


def test_draws_that_disagree_depend_on_the_tuning_draw():
    NLL_GAIN[("cog_fc", "2")] = -0.02
    try:
        tables = bundle_tables(make_bundle())
    finally:
        NLL_GAIN[("cog_fc", "2")] = 0.02
    assert _verdict(tables, "cog_fc")["answer"] == DEPENDS


def _trials(value: float, ranges: str | None) -> pd.DataFrame:
    rows = [{"trial": i, "run": f"trial_{i:02d}", "state": "complete", "counted": True, "draw": "1",
             "optim.follower_lr": v, "overrides": f"optim.follower_lr={v:g}", "val_nll": 0.3 - 0.01 * (v == value),
             "chosen": "*" if v == value else ""} | ({"ranges": ranges} if ranges else {})
            for i, v in enumerate((value, 1e-3, 3e-3))]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("value, edge", [(2.9e-2, "optim.follower_lr=highest"), (3.1e-4, "optim.follower_lr=lowest"),
                                         (3e-3, "")])
def test_a_chosen_knob_at_its_range_edge_is_flagged_from_the_recorded_ranges(value, edge):
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "budget": 3})
    ranges = search_ranges.ranges_text([search_ranges.Knob("optim.follower_lr", 3e-4, 3e-2, log=True)])
    bundle.set_trials("d-baseline", _trials(value, ranges))
    chosen = bundle_tables(bundle)["chosen"].iloc[0]
    assert chosen["ranges"] == "optim.follower_lr=log[0.0003,0.03]" and chosen["at_edge"] == edge
    old = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "budget": 3})
    old.set_trials("d-baseline", _trials(value, None))  # written before trials.csv recorded the ranges
    assert bundle_tables(old)["chosen"].iloc[0]["at_edge"] == "unknown (no ranges recorded)"


def test_the_chosen_table_counts_a_failed_attempt_that_was_retried():
    """A trial stopped mid-run is recorded as failed and not counted; its retry (``retry_of``) is counted in its
    place. The study still has its whole budget, no counted trial failed, and ``retried`` shows the stop."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "budget": 3})
    trials = _trials(1e-3, None)
    failed = trials.iloc[[1]].assign(state="fail", counted=False, chosen="", val_nll=float("nan"))
    retry = trials.iloc[[1]].assign(trial=3, retry_of=1)
    extra = trials.iloc[[2]].assign(trial=4, state="fail", counted=False, chosen="")  # past the budget: no retry
    bundle.set_trials("d-baseline", pd.concat([trials.drop(index=1), failed, retry, extra], ignore_index=True))
    chosen = bundle_tables(bundle)["chosen"].iloc[0]
    assert (chosen["trials"], chosen["failed"], chosen["pruned"], chosen["retried"]) == (3, 0, 0, 1)


def test_searched_ranges_read_back_as_written_and_refuse_anything_else():
    knobs = [search_ranges.Knob("optim.follower_lr", 3e-4, 3e-2, log=True),
             search_ranges.Knob("method.label_smoothing", 0.02, 0.2, log=False)]
    back = search_ranges.parse_ranges(search_ranges.ranges_text(knobs))
    assert [(k.key, k.low, k.high, k.log) for k in back] == [(k.key, k.low, k.high, k.log) for k in knobs]
    for bad in ("optim.follower_lr=[0.1,1]", "x=log[0,1]", "x=linear[2,1]", "x=log[nan,1]"):
        with pytest.raises(ValueError, match="not a searched range"):
            search_ranges.parse_ranges(bad)


def test_the_report_shows_the_answers_and_a_rerun_leaves_no_stale_table(tmp_path):
    write_bundle_report(make_bundle(idle_draw="2"), tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "Both tuning draws" in html and "claims at this scale" in html and NOT_TESTED in html
    assert (tmp_path / "verdicts.csv").is_file()
    tuning_only = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "budget": 3})
    tuning_only.set_trials("d-baseline", _trials(3e-3, None))
    write_bundle_report(tuning_only, tmp_path)
    assert (tmp_path / "chosen.csv").is_file()
    for gone in ("verdicts.csv", "summary.md", "claims.csv", "report.html"):
        assert not (tmp_path / gone).exists(), gone


def test_campaign_json_records_what_each_planned_run_is():
    spec = campaign.RunSpec("d-cog_fc-d2-seed1", (), (), None, campaign.Labels("d", "cog_fc", "final", 1, "2"))
    record = campaign.spec_record(campaign.Planned(spec, campaign.Config(), "x", campaign.NEW))
    assert record["labels"] == {"data": "d", "method": "cog_fc", "role": "final", "seed": 1, "draw": "2",
                                "trial": "", "ratio": ""}


def test_the_scope_table_counts_runs_by_how_they_ended_and_what_they_trained_with():
    """The headline's scope comes from runs.csv: split sizes and epochs of finished runs, the settled count of
    those the convergence rule could judge, and the epoch hours of the runs that recorded them."""
    bundle = make_bundle(finished=lambda method, draw, seed: (method, draw, seed) != ("cog_fc", "2", 2))
    done = bundle.runs["status"] == "done"
    bundle.runs.loc[done, ["train_size", "val_size", "test_size", "threads"]] = [48000, 12000, 10000, 1]
    bundle.runs.loc[done, "epochs_run"] = 20
    bundle.runs.loc[done, "wall_s"] = 360.0
    first = bundle.runs.index[done][0]
    bundle.runs.loc[first, "epochs_run"] = 18  # a run that stopped early widens the epochs cell to a range
    extra = {c: "" for c in bundles.RUN_COLUMNS} | {"run": "d-baseline-trial_00", "campaign": "c", "data": "d",
                                                    "method": "baseline", "role": "trial", "status": "pruned",
                                                    "wall_s": ""}
    bundle.runs = pd.concat([bundle.runs, pd.DataFrame([extra])], ignore_index=True)
    table = bundle_tables(bundle)["scope"].set_index("role")
    final = table.loc["final"]
    assert (final["runs"], final["done"], final["pruned"], final["failed"]) == (17, 17, 0, 0)
    assert (final["train_size"], final["test_size"], final["epochs"], final["threads"]) == ("48000", "10000",
                                                                                             "18-20", "1")
    assert final["converged"] == "0 of 0"  # no curves recorded: the rule cannot judge, nothing is counted settled
    assert final["epoch_hours"] == pytest.approx(17 * 360 / 3600)
    assert (final["untimed"], final["untimed_hours_est"]) == (0, 0.0)
    trial = table.loc["trial"]
    assert (trial["runs"], trial["done"], trial["pruned"], trial["epoch_hours"]) == (1, 0, 1, 0.0)
    assert trial["train_size"] == "" and trial["converged"] == "0 of 0"
    assert trial["untimed"] == 1 and pd.isna(trial["untimed_hours_est"])  # no epochs known, no timed peer: no guess


def test_the_scope_table_estimates_the_hours_of_runs_that_recorded_none():
    """Pruned trials collected by old code have no wall_s: trials.csv's epochs at the median seconds per epoch of
    the role's timed runs, apart from the measured epoch_hours; a run trials.csv does not know leaves it empty."""
    def trial(name, wall_s, epochs_run):
        return {c: "" for c in bundles.RUN_COLUMNS} | {"run": f"d-baseline-{name}", "campaign": "c", "data": "d",
                                                        "method": "baseline", "role": "trial", "status": "pruned",
                                                        "wall_s": wall_s, "epochs_run": epochs_run}
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    bundle.runs = pd.DataFrame([trial("trial_00", "", ""), trial("trial_01", 60.0, 2), trial("trial_02", 900.0, 10)])
    bundle.set_trials("d-baseline", pd.DataFrame([{"trial": 0, "run": "trial_00", "epochs_trained": 4},
                                                  {"trial": 3, "run": "trial_00", "epochs_trained": 6},  # its retry
                                                  {"trial": 1, "run": "trial_01", "epochs_trained": 2}]))
    scope = bundle_tables(bundle)["scope"].iloc[0]
    assert scope["epoch_hours"] == pytest.approx(960 / 3600)  # measured: the timed runs alone
    assert scope["untimed"] == 1 and scope["untimed_hours_est"] == pytest.approx(6 * 60 / 3600)  # median of 30, 90 s
    bundle.runs.loc[2, ["wall_s", "epochs_run"]] = ""  # trial_02 untimed too, and unknown to trials.csv
    scope = bundle_tables(bundle)["scope"].iloc[0]
    assert scope["untimed"] == 2 and pd.isna(scope["untimed_hours_est"])


def test_scope_of_a_bundle_without_a_finished_run_and_of_a_resumed_run():
    """Early in a pruned tuning every run so far was pruned: the table says so instead of failing the report."""
    rows = [{c: "" for c in bundles.RUN_COLUMNS} | {"run": f"t{i}", "campaign": "c", "data": "d", "method": "m",
                                                    "role": "trial", "status": "pruned"} for i in range(2)]
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    for row in rows:
        bundle.add_run(row, pd.DataFrame(columns=bundles.RESULT_COLUMNS), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    table = bundle_tables(bundle)["scope"].iloc[0]
    assert (table["runs"], table["done"], table["pruned"], table["converged"], table["epoch_hours"]) == (
        2, 0, 2, "0 of 0", 0.0)
    from mtl_cog.analysis.bundle_scope import _values
    assert _values(pd.Series(["1", "1 2", "", None])) == "1-2"  # a run resumed under another thread count


def test_a_reversal_in_another_data_set_is_not_this_ones():
    from mtl_cog.analysis.bundle_answers import reversed_predictions

    rows = [{"data": data, "draw": "1", "method": method, "seed": 0, "task": "a", "accuracy": accuracy}
            for data, flipped in (("d", False), ("e", True))
            for method, accuracy in (("baseline", 0.8), ("baseline+ts_guo", 0.2 if flipped else 0.8))]
    scores = pd.DataFrame(rows)
    assert reversed_predictions(scores, "d", "1", "baseline+ts_guo") == ""
    assert reversed_predictions(scores, "e", "1", "baseline+ts_guo").endswith(": a (seed 0)")
