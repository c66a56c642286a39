"""The dry run prints the pace a campaign's finished runs measured beside the model's estimate (core-seconds:
wall time × threads), and nothing of the kind before two of its runs have finished."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from mtl_cog.experiments.campaign import BUNDLED, Planned
from mtl_cog.experiments.estimates import measured_pace
from mtl_cog.experiments.sweep import NEW, UNFINISHED
from mtl_cog.reporting import bundle as bundles


def planned(run: str, state: str) -> Planned:
    return Planned(SimpleNamespace(run=run), None, run, state)


def write_bundle(out, walls: dict[str, tuple[float, int]]) -> None:
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "counterparts": {}})
    for run, (wall, threads) in walls.items():
        row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": run, "campaign": "c", "data": "d", "method": "m",
                                                      "role": "final", "draw": "1", "seed": 0, "status": "done",
                                                      "config_digest": run, "wall_s": wall, "threads": threads}
        results = pd.DataFrame([{"run": run, "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
        bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.write_bundle(bundles.bundle_dir(out), bundle)


def test_the_pace_is_the_median_core_seconds_of_this_campaigns_finished_runs(tmp_path):
    write_bundle(tmp_path, {"a": (100.0, 1), "b": (200.0, 1), "c": (300.0, 2), "other": (9999.0, 1)})
    plan = [planned("a", BUNDLED), planned("b", BUNDLED), planned("c", BUNDLED), planned("d", NEW),
            planned("e", UNFINISHED)]  # "other" is in the bundle but not in this plan: not counted
    line = measured_pace(plan, tmp_path)
    assert line == ("measured: 3 finished runs of this campaign took 200 core-seconds each (median); at that pace "
                    "the 2 still to run take 0.1 CPU core-hours")


def test_no_pace_before_two_runs_have_finished(tmp_path):
    assert measured_pace([planned("a", NEW)], tmp_path) is None  # no bundle yet
    write_bundle(tmp_path, {"a": (100.0, 1)})
    assert measured_pace([planned("a", BUNDLED), planned("b", NEW)], tmp_path) is None
