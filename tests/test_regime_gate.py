"""The regime gate read from a sweep's bundle: known answers for a passing, a failing and an unfinished setting."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mtl_cog.analysis.regime_gate import regime_gate
from mtl_cog.bundles.bundle import RUN_COLUMNS, Bundle


def _bundle(settings: dict[str, list[tuple[float, float, float, float]]]) -> Bundle:
    """settings: label -> per seed (val NLL, test ECE, test NLL, test NLL after TS) at both checkpoints (the last
    epoch's numbers are the selected ones + 0.1 NLL)."""
    specs, runs, results = {}, [], []
    index = 0
    for label, seeds in settings.items():
        for seed, values in enumerate(seeds):
            run = f"run_{index:02d}"
            index += 1
            specs[run] = {"setting": f"digest-{label}", "overrides": [f"optim.follower_lr={label}", f"seed={seed}"]}
            if values is None:
                continue
            runs.append({**dict.fromkeys(RUN_COLUMNS, ""), "run": run, "status": "done", "role": "sweep",
                         "seed": seed, "method": "baseline", "data": "d"})
            val, ece, nll, nll_ts = values
            for tag, shift in (("", 0.0), ("@last", 0.1)):
                results += [(run, f"val{tag}", "mean", "nll", val + shift), (run, f"test{tag}", "mean", "ece@15", ece),
                            (run, f"test{tag}", "mean", "nll", nll + shift),
                            (run, f"test{tag}+ts", "mean", "nll", nll_ts)]
    return Bundle({"campaign": "sweep-x", "specs": specs}, pd.DataFrame(runs, columns=RUN_COLUMNS),
                  pd.DataFrame(results, columns=["run", "split", "task", "metric", "value"]))


def test_the_gate_passes_fails_and_waits_as_the_plan_says():
    table = regime_gate(_bundle({
        "1e-3": [(0.40, 0.06, 0.50, 0.45), (0.41, 0.05, 0.52, 0.46), (0.42, 0.07, 0.48, 0.44)],  # ~10 % gain
        "3e-4": [(0.30, 0.02, 0.40, 0.39), (0.31, 0.02, 0.41, 0.40), (0.32, 0.02, 0.42, 0.41)],  # calibrated
        "3e-3": [(0.5, 0.1, 0.6, 0.5), None, None],  # one seed finished: no interval, no pass
    })).set_index(["setting", "rule"])
    row = table.loc[("optim.follower_lr=1e-3", "best validation Brier")]
    changes = np.array([(0.45 - 0.50) / 0.50, (0.46 - 0.52) / 0.52, (0.44 - 0.48) / 0.48])
    half = stats.t.ppf(0.975, 2) * changes.std(ddof=1) / math.sqrt(3)
    assert row["ts_nll_change"] == pytest.approx(changes.mean())
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((changes.mean() - half, changes.mean() + half))
    assert row["test_ece@15"] == pytest.approx(0.06) and row["passes"] and row["seeds"] == "3 of 3"
    last = table.loc[("optim.follower_lr=1e-3", "last epoch")]
    assert last["test_nll"] == pytest.approx(0.60) and last["passes"]  # the last epoch's own splits
    assert not table.loc[("optim.follower_lr=3e-4", "best validation Brier"), "passes"]  # ECE 0.02 < 0.03
    one = table.loc[("optim.follower_lr=3e-3", "best validation Brier")]
    assert one["seeds"] == "1 of 3" and math.isnan(one["ci_low"]) and pd.isna(one["passes"])
    assert "tuned" not in table  # no setting is called the tuned one while a setting lacks planned seeds


def test_the_tuned_setting_is_the_lowest_validation_nll_once_every_setting_finished():
    table = regime_gate(_bundle({"1e-3": [(0.40, 0.06, 0.50, 0.45)] * 3, "3e-4": [(0.30, 0.02, 0.40, 0.39)] * 3}))
    tuned = table[table["tuned"] == "*"]
    assert set(tuned["setting"]) == {"optim.follower_lr=3e-4"} and len(tuned) == 2  # both rules' rows


def test_a_setting_without_post_hoc_splits_gets_an_empty_row():
    bundle = _bundle({"1e-3": [(0.4, 0.06, 0.5, 0.45)] * 3})
    bundle.results = bundle.results[~bundle.results["split"].str.contains(r"\+ts")]
    table = regime_gate(bundle)
    assert set(table["seeds"]) == {"0 of 3"} and "passes" not in table
    assert table["note"].str.startswith("3 finished run(s) lack").all()


def _campaign_bundle(draws: dict[str, list[tuple[float, float, float, float] | None]]) -> Bundle:
    """A campaign's final baseline runs per draw (seeds planned in campaign.json with their labels and rate);
    per seed (val NLL, test ECE, test NLL, test NLL after TS) at both checkpoints, None: not finished; a cog_fc
    final run beside them, which the gate must not read."""
    specs, runs, results = {}, [], []
    for draw, seeds in draws.items():
        for seed, values in enumerate(seeds):
            for method in ("baseline", "cog_fc"):
                run = f"d-{method}-d{draw}-seed{seed}"
                labels = {"data": "d", "method": method, "role": "final", "draw": draw, "seed": seed}
                specs[run] = {"setting": f"{method}-{draw}", "labels": labels,
                              "overrides": [f"optim.follower_lr={draw}e-3", f"seed={seed}"]}
                if values is None:
                    continue
                runs.append({**dict.fromkeys(RUN_COLUMNS, ""), **labels, "run": run, "status": "done"})
                val, ece, nll, nll_ts = values if method == "baseline" else (9.0, 0.5, 9.0, 1.0)
                for tag in ("", "@last"):
                    results += [(run, f"val{tag}", "mean", "nll", val), (run, f"test{tag}", "mean", "ece@15", ece),
                                (run, f"test{tag}", "mean", "nll", nll), (run, f"test{tag}+ts", "mean", "nll", nll_ts)]
    return Bundle({"campaign": "reproduce-fair", "specs": specs}, pd.DataFrame(runs, columns=RUN_COLUMNS),
                  pd.DataFrame(results, columns=["run", "split", "task", "metric", "value"]))


def test_a_campaign_bundle_re_measures_the_gate_on_its_final_baselines_per_draw():
    """No sweep in the bundle: the gate is read on each draw's final baseline runs (the claims' counterpart),
    named by data set, draw and rate; a draw with seeds still to run says so and does not pass yet."""
    gain = [(0.40, 0.06, 0.50, 0.45), (0.41, 0.05, 0.52, 0.46), (0.42, 0.07, 0.48, 0.44)]
    table = regime_gate(_campaign_bundle({"1": gain, "2": [*gain, None]})).set_index(["setting", "rule"])
    assert set(table.index.get_level_values("setting")) == {"d, baseline, draw 1 (optim.follower_lr=1e-3)",
                                                            "d, baseline, draw 2 (optim.follower_lr=2e-3)"}
    one = table.loc[("d, baseline, draw 1 (optim.follower_lr=1e-3)", "best validation Brier")]
    changes = np.array([(0.45 - 0.50) / 0.50, (0.46 - 0.52) / 0.52, (0.44 - 0.48) / 0.48])
    assert one["ts_nll_change"] == pytest.approx(changes.mean()) and one["test_ece@15"] == pytest.approx(0.06)
    assert one["seeds"] == "3 of 3" and one["passes"] and pd.isna(one.get("note"))  # cog_fc's runs not read
    assert "confidence − accuracy" not in table  # no reliability bins in this bundle: no column of blanks
    two = table.loc[("d, baseline, draw 2 (optim.follower_lr=2e-3)", "last epoch")]
    assert two["seeds"] == "3 of 4" and pd.isna(two["passes"]) and two["note"].startswith("incomplete")


def test_the_final_baseline_gate_names_what_keeps_a_row_from_a_reading():
    """Seeds still running: 'incomplete'; every seed finished but one lacks the TS split: no pass and no
    'incomplete' (it will never fill in); fewer seeds planned than the gate needs: no pass; a draw not begun: an
    empty row without notes; an older bundle whose specs are digests alone is read (no rate in its name)."""
    gain = [(0.40, 0.06, 0.50, 0.45), (0.41, 0.05, 0.52, 0.46), (0.42, 0.07, 0.48, 0.44)]
    bundle = _campaign_bundle({"1": gain, "2": [None] * 3, "3": gain[:2]})
    lacking = bundle.results["run"].eq("d-baseline-d1-seed2") & bundle.results["split"].str.endswith("+ts")
    bundle.results = bundle.results[~lacking]
    table = regime_gate(bundle).set_index(["setting", "rule"])
    one = table.loc[("d, baseline, draw 1 (optim.follower_lr=1e-3)", "best validation Brier")]
    assert one["seeds"] == "2 of 3" and pd.isna(one["passes"])
    assert one["note"] == "1 finished run(s) lack a value the gate reads"
    two = table.loc[("d, baseline, draw 2", "best validation Brier")]
    assert two["seeds"] == "0 of 3" and pd.isna(two["passes"]) and pd.isna(two["note"])
    three = table.loc[("d, baseline, draw 3 (optim.follower_lr=3e-3)", "best validation Brier")]
    assert three["seeds"] == "2 of 2" and pd.isna(three["passes"])
    assert three["note"] == "2 seed(s) planned: the gate reads 3 or more"
    bundle.campaign["specs"] = {run: "digest" for run in bundle.campaign["specs"]}
    assert set(regime_gate(bundle)["setting"]) == {"d, baseline, draw 1", "d, baseline, draw 3"}  # from what ran


def test_a_one_draw_campaign_names_no_draw():
    bundle = _campaign_bundle({"": [(0.40, 0.06, 0.50, 0.45)] * 3})
    assert set(regime_gate(bundle)["setting"]) == {"d, baseline (optim.follower_lr=e-3)"}


def test_confidence_minus_accuracy_is_recounted_from_the_bins_with_its_sign():
    """A binary task (bins of p) and a 3-class one (bins of the top label): the gap from the bins equals mean
    top-label confidence minus accuracy computed from the logits (the sums keep 6 digits); a binary task with every
    p >= 0.5 reads the same either way; a recorded accuracy the bins cannot reproduce gives NaN, not a guess."""
    from mtl_cog.bundles.bundle_reliability import confidence_gaps, reliability_rows
    from mtl_cog.evaluation.predictions import Predictions

    rng = np.random.default_rng(0)
    n = 4000
    binary_z = rng.normal(0, 3, n)  # overconfident: labels drawn from sigmoid(z / 2)
    binary_y = (rng.random(n) < 1 / (1 + np.exp(-binary_z / 2))).astype(int)
    multi_z = rng.normal(0, 1, (n, 3)) * 0.5  # underconfident: labels follow the argmax more often than p says
    multi_y = np.where(rng.random(n) < 0.8, multi_z.argmax(1), rng.integers(0, 3, n))
    positive_z = np.abs(binary_z) + 0.01  # every prediction p >= 0.5
    predictions = Predictions(["bin", "multi", "pos"], [binary_z, multi_z, positive_z], [binary_y, multi_y, binary_y])
    rows = reliability_rows(predictions, "test", run="r")

    def truth(z, y):
        if z.ndim == 1:
            p = 1 / (1 + np.exp(-z))
            return np.maximum(p, 1 - p).mean() - ((p >= 0.5) == y).mean(), ((p >= 0.5) == y).mean()
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        return p.max(1).mean() - (p.argmax(1) == y).mean(), (p.argmax(1) == y).mean()

    expected = {"bin": truth(binary_z, binary_y), "multi": truth(multi_z, multi_y), "pos": truth(positive_z, binary_y)}
    accuracy = pd.Series({("r", t): float(f"{acc:.8g}") for t, (_, acc) in expected.items()})
    gaps = confidence_gaps(rows, accuracy)
    for task, (gap, _) in expected.items():
        assert gaps[("r", task)] == pytest.approx(gap, abs=1e-5)
    assert gaps[("r", "bin")] > 0 > gaps[("r", "multi")]
    accuracy[("r", "bin")] += 0.01  # not the accuracy of these predictions: no reading fits
    assert math.isnan(confidence_gaps(rows, accuracy)[("r", "bin")])


def test_a_task_keeps_one_bin_convention_across_runs():
    """Run r2 of a binary task has a prediction at exactly p = 0.5 (binned above, predicted negative), so its binary
    reading misses the accuracy while the multi-class one fits by coincidence (2 positives, 2 correct): the task's
    other runs (r1, r3) decide it is binary by majority, and r2 reads NaN instead of the wrong gap."""
    from mtl_cog.bundles.bundle_reliability import confidence_gaps, reliability_rows
    from mtl_cog.evaluation.predictions import Predictions

    rng = np.random.default_rng(1)
    z = rng.normal(0, 3, 500)
    y = (rng.random(500) < 1 / (1 + np.exp(-z))).astype(int)
    rows = pd.concat([reliability_rows(Predictions(["t"], [z], [y]), "test", run="r1"),
                      reliability_rows(Predictions(["t"], [-z], [1 - y]), "test", run="r3"),
                      reliability_rows(Predictions(["t"], [np.array([0.0, 2, 2, -2])], [np.array([0, 1, 0, 1])]),
                                       "test", run="r2")])
    accuracy = pd.Series({("r1", "t"): ((z > 0) == y).mean(), ("r3", "t"): ((z > 0) == y).mean(), ("r2", "t"): 0.5})
    gaps = confidence_gaps(rows, accuracy)
    p = 1 / (1 + np.exp(-z))
    assert gaps[("r1", "t")] == pytest.approx(np.maximum(p, 1 - p).mean() - ((z > 0) == y).mean(), abs=1e-5)
    assert math.isnan(gaps[("r2", "t")])
    alone = confidence_gaps(rows[rows["run"] == "r2"], accuracy)  # no other run: the coincidence is not caught
    assert not math.isnan(alone[("r2", "t")])


def test_the_gate_shows_the_sign_at_the_selected_checkpoint_and_says_when_bins_cannot_give_it():
    from mtl_cog.bundles.bundle_reliability import reliability_rows
    from mtl_cog.evaluation.predictions import Predictions

    gain = [(0.40, 0.06, 0.50, 0.45), (0.41, 0.05, 0.52, 0.46), (0.42, 0.07, 0.48, 0.44)]
    bundle = _campaign_bundle({"1": gain})
    z = np.array([3.0, 3.0, 3.0, -3.0])  # confidence 0.9526 on each; 3 of 4 right: overconfident by 0.2026
    y = np.array([1, 1, 0, 0])
    baselines = [r for r in bundle.runs["run"] if "-baseline-" in r]
    bundle.reliability = pd.concat([reliability_rows(Predictions(["a", "b"], [z, z], [y, y]), "test", run=r)
                                    for r in baselines])
    bundle.results = pd.concat([bundle.results, pd.DataFrame(
        [(r, "test", t, "accuracy", 0.75) for r in baselines for t in ("a", "b")], columns=bundle.results.columns)])
    table = regime_gate(bundle).set_index("rule")
    gap = 1 / (1 + math.exp(-3)) - 0.75
    assert table.loc["best validation Brier", "confidence − accuracy"] == pytest.approx(gap, abs=1e-5)
    assert pd.isna(table.loc["last epoch", "confidence − accuracy"])  # bins of the selected checkpoint only
    off = bundle.results["run"].eq(baselines[0]) & bundle.results["metric"].eq("accuracy") & \
        bundle.results["task"].eq("a")
    bundle.results.loc[off, "value"] = 0.5  # these bins cannot give that accuracy
    row = regime_gate(bundle).set_index("rule").loc["best validation Brier"]
    assert pd.isna(row["confidence − accuracy"])  # one task unread: the run's task mean is no mean of its tasks
    assert row["note"] == "confidence − accuracy: 1 run(s) whose bins do not reproduce their accuracy"
