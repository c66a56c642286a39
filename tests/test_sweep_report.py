"""A sweep's settings over seeds (reporting/sweep_report.py): labels from the recorded overrides, never pooled,
each setting against the grid's first, paired by seed."""

import pandas as pd
import pytest

from mtl_cog.reporting import bundle as bundles
from mtl_cog.reporting.bundle_report import bundle_tables
from mtl_cog.reporting.sweep_report import DIFFERS, INCONCLUSIVE, INSIDE

SEED_EFFECT = {0: 0.0, 1: 0.02, 2: -0.015}  # what a seed moves every metric by: the seed noise


def sweep_bundle(shift_of: dict[str, float], wobble: float = 0.0) -> bundles.Bundle:
    """A sweep over precision (grid order: no, then the others) × seeds 0-2, two tasks; ``shift_of[precision]``
    moves every metric of that setting; ``wobble`` adds a per-seed change of sign (a difference that is noise)."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "sweep-baseline", "specs": {}})
    index = 0
    for precision, shift in shift_of.items():
        for seed, effect in SEED_EFFECT.items():
            run = f"run_{index:02d}"
            bundle.campaign["specs"][run] = {"overrides": [
                "wandb_group=sweep-x", "train.epochs=20", f"train.precision={precision}", f"seed={seed}"]}
            row = {c: "" for c in bundles.RUN_COLUMNS} | {
                "run": run, "campaign": "sweep-baseline", "data": "d", "method": "baseline", "role": "sweep",
                "seed": seed, "status": "done", "config_digest": run, "wall_s": 100.0 if precision == "no" else 60.0}
            noise = wobble * (1 if seed % 2 else -1) * (precision != "no")
            values = [{"run": run, "split": split, "task": task, "metric": metric,
                       "value": base + effect + shift + noise + 0.01 * i}
                      for split in ("val", "test") for i, task in enumerate(["a", "b"])
                      for metric, base in (("accuracy", 0.9), ("nll", 0.3), ("brier", 0.1), ("ece@15", 0.02))]
            results = pd.DataFrame(values)
            means = results.groupby(["run", "split", "metric"], as_index=False)["value"].mean().assign(task="mean")
            bundle.add_run(row, pd.concat([results, means]), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
            index += 1
    return bundle


def test_each_setting_is_a_row_over_its_seeds_labelled_by_what_varies():
    tables = bundle_tables(sweep_bundle({"no": 0.0, "bf16": 0.0}))
    settings = tables["sweep_settings"]
    assert list(settings["setting"]) == ["train.precision=no", "train.precision=bf16"]  # grid order, seed left out
    assert list(settings["seeds"]) == [3, 3]
    assert settings["nll"].iloc[0] == "0.3067 ± 0.0176"  # 0.3 + tasks (0.005) + seeds (0.0017); the seeds' std
    assert settings["time_ratio"].tolist() == pytest.approx([1.0, 0.6])
    assert "summary" not in tables  # sweep runs are never pooled into a method's mean


@pytest.mark.parametrize("shift, wobble, reading", [
    (0.0, 0.001, INSIDE),      # a per-seed wobble far inside the seed std
    (0.05, 0.001, DIFFERS),    # every seed moved by 0.05: the interval excludes 0
    (0.0, 0.06, INCONCLUSIVE), # a wobble larger than the seed noise: the interval holds 0 but says little
])
def test_a_setting_against_the_first_paired_by_seed(shift, wobble, reading):
    paired = bundle_tables(sweep_bundle({"no": 0.0, "bf16": shift}, wobble))["sweep_paired"]
    nll = paired[paired["metric"] == "nll"].iloc[0]
    assert nll["reference"] == "train.precision=no" and nll["seeds"] == 3
    assert nll["difference"] == pytest.approx(shift - wobble / 3, abs=1e-9)  # the wobble is -, +, - over seeds 0-2
    assert nll["reading"] == reading
    assert nll["reference_seed_std"] == pytest.approx(pd.Series(SEED_EFFECT).std(ddof=1))


def test_a_single_setting_has_no_paired_table():
    assert "sweep_paired" not in bundle_tables(sweep_bundle({"no": 0.0}))
