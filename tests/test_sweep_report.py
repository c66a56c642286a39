"""A sweep's settings over seeds (analysis/sweep_report.py): settings from the recorded setting digests, labelled
by what differs between them, in grid order, never pooled; each against the grid's first, paired by seed, with an
equivalence reading."""

import math

import pandas as pd
import pytest

from mtl_cog.analysis.sweep_report import DIFFERS, INCONCLUSIVE, INSIDE
from mtl_cog.bundles import bundle as bundles
from mtl_cog.reporting.bundle_report import bundle_tables

BASES = {"accuracy": 0.9, "nll": 0.3, "brier": 0.1, "ece@15": 0.02}
SEED_EFFECT = {0: 0.0, 1: 0.02, 2: -0.015}  # what a seed moves every metric by: the seed noise (std 0.0176)


def sweep_bundle(shift_of: dict[str, float], noise: dict[int, float] | None = None, seeds=(0, 1, 2),
                 finished=lambda run: True) -> bundles.Bundle:
    """A sweep over precision (grid order as given) × seeds, two tasks; ``shift_of[precision]`` moves every
    metric of that setting, ``noise[seed]`` moves every setting but the first (a per-seed difference)."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "sweep-baseline", "specs": {}})
    for index, (precision, seed) in enumerate((p, s) for p in shift_of for s in seeds):
        run = f"run_{index:02d}"
        bundle.campaign["specs"][run] = {"setting": f"digest-{precision}", "overrides": [
            f"wandb_group=sweep-{run}", "train.epochs=20", f"train.precision={precision}", f"seed={seed}"]}
        if not finished(run):
            continue
        row = {c: "" for c in bundles.RUN_COLUMNS} | {
            "run": run, "campaign": "sweep-baseline", "data": "d", "method": "baseline", "role": "sweep",
            "seed": seed, "status": "done", "config_digest": run, "converged": True,
            "wall_s": 100.0 if precision == "no" else 60.0}
        moved = SEED_EFFECT[seed] + shift_of[precision] + ((noise or {}).get(seed, 0.0) if index >= len(seeds) else 0)
        results = pd.DataFrame([{"run": run, "split": "test", "task": task, "metric": metric,
                                 "value": base + moved + 0.01 * i}
                                for i, task in enumerate(["a", "b"])
                                for metric, base in BASES.items()])
        means = results.groupby(["run", "split", "metric"], as_index=False)["value"].mean().assign(task="mean")
        bundle.add_run(row, pd.concat([results, means]), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    return bundle


def test_each_setting_is_a_row_over_its_seeds_labelled_by_what_differs_between_settings():
    tables = bundle_tables(sweep_bundle({"no": 0.0, "bf16": 0.0}))
    settings = tables["sweep_settings"]
    # the seed and the per-run wandb_group differ within a setting; train.epochs is the same everywhere
    assert list(settings["setting"]) == ["train.precision=no", "train.precision=bf16"]
    assert list(settings["seeds"]) == ["0 1 2", "0 1 2"] and list(settings["converged"]) == ["3 of 3", "3 of 3"]
    assert settings["nll"].iloc[0] == "0.3067 ± 0.0176"  # 0.3 + tasks (0.005) + seeds (0.0017); the seeds' std
    assert settings["wall_vs_first"].tolist() == pytest.approx([1.0, 0.6])
    assert "summary" not in tables


@pytest.mark.parametrize("shift, noise, reading, better", [
    (0.0, {0: 1e-4, 1: -1e-4, 2: 0.0}, INSIDE, INCONCLUSIVE),   # the whole interval far inside ± the seed std
    (0.05, {0: 1e-3, 1: -1e-3, 2: 0.0}, DIFFERS, "reference"),   # every seed moved up by 0.05: worse NLL
    (0.0, {0: 0.02, 1: -0.02, 2: 0.0}, INCONCLUSIVE, INCONCLUSIVE),  # mean 0, but the interval (±0.05) is wider
])                                                                   # than seed noise: it says little
def test_a_setting_against_the_first_paired_by_seed(shift, noise, reading, better):
    paired = bundle_tables(sweep_bundle({"no": 0.0, "bf16": shift}, noise))["sweep_paired"]
    nll = paired[paired["metric"] == "nll"].iloc[0]
    assert nll["reference"] == "train.precision=no" and nll["setting"] == "train.precision=bf16"
    assert nll["n_seeds"] == 3 and nll["mean_difference"] == pytest.approx(shift, abs=1e-9)
    assert nll["reading"] == reading and nll["better"] == better.replace("reference", "counterpart")
    assert nll["seed_std"] == pytest.approx(pd.Series(SEED_EFFECT).std(ddof=1), rel=0.5)


def test_labels_and_reference_do_not_move_while_the_sweep_runs():
    # the grid's first setting has not finished: it stays the reference (no paired rows yet), and the others keep
    # their full labels
    bundle = sweep_bundle({"no": 0.0, "bf16": 0.0, "fp16": 0.0}, finished=lambda run: run >= "run_03")
    tables = bundle_tables(bundle)
    settings = tables["sweep_settings"]
    assert list(settings["setting"]) == ["train.precision=no", "train.precision=bf16", "train.precision=fp16"]
    assert settings["seeds"].iloc[0] == "" and math.isnan(settings["wall_vs_first"].iloc[1])
    assert "sweep_paired" not in tables


def test_damaged_or_old_bundles_are_read_without_a_crash():
    bundle = sweep_bundle({"no": 0.0, "bf16": 0.0})
    bundle.results.loc[(bundle.results["run"] == "run_04") & (bundle.results["metric"] == "nll"), "value"] = math.inf
    paired = bundle_tables(bundle)["sweep_paired"]
    assert "nll" not in set(paired["metric"]) and "brier" in set(paired["metric"])  # a non-finite metric is left out
    bundle.campaign["specs"]["run_05"] = "abcdef"  # a run recorded by digest only (an older bundle): left out
    assert bundle_tables(bundle)["sweep_settings"]["seeds"].tolist() == ["0 1 2", "0 1"]
    bundle.campaign["specs"] = {run: "abcdef" for run in bundle.campaign["specs"]}
    assert "sweep_settings" not in bundle_tables(bundle)


def test_a_sweep_without_a_seed_axis_has_no_paired_table():
    tables = bundle_tables(sweep_bundle({"no": 0.0, "bf16": 0.0}, seeds=(0,)))
    assert list(tables["sweep_settings"]["seeds"]) == ["0", "0"]
    assert "sweep_paired" not in tables
