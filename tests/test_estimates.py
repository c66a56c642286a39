"""The dry run prints the pace a campaign's finished runs measured beside the model's estimate (core-seconds:
wall time × threads), and nothing of the kind before two of its runs have finished."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from mtl_cog.bundles import bundle as bundles
from mtl_cog.experiments.campaign import BUNDLED, Planned
from mtl_cog.experiments.estimates import measured_pace
from mtl_cog.experiments.sweep import NEW, UNFINISHED


def planned(run: str, state: str, data: str = "d") -> Planned:
    return Planned(SimpleNamespace(run=run, labels=SimpleNamespace(data=data)), None, run, state)


def write_bundle(out, walls: dict[str, tuple[float, int]], data: dict[str, str] | None = None) -> None:
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "counterparts": {}})
    for run, (wall, threads) in walls.items():
        row = {c: "" for c in bundles.RUN_COLUMNS} | {
            "run": run, "campaign": "c", "data": (data or {}).get(run, "d"), "method": "m", "role": "final",
            "draw": "1", "seed": 0, "status": "done", "config_digest": run, "wall_s": wall, "threads": threads}
        results = pd.DataFrame([{"run": run, "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
        bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.write_bundle(bundles.bundle_dir(out), bundle)


def test_the_pace_is_the_median_core_seconds_of_this_campaigns_finished_runs(tmp_path):
    write_bundle(tmp_path, {"a": (100.0, 1), "b": (200.0, 1), "c": (300.0, 2), "other": (9999.0, 1)})
    plan = [planned("a", BUNDLED), planned("b", BUNDLED), planned("c", BUNDLED), planned("d", NEW),
            planned("e", UNFINISHED)]  # "other" is in the bundle but not in this plan: not counted
    line = measured_pace(plan, tmp_path)
    assert line == ("measured on d: 3 finished runs of this campaign took 200 core-seconds each (median); at that "
                    "pace its 2 final runs still to run take 0.1 CPU core-hours (tuning not included)")


def test_no_pace_before_two_runs_have_finished(tmp_path):
    assert measured_pace([planned("a", NEW)], tmp_path) is None  # no bundle yet
    write_bundle(tmp_path, {"a": (100.0, 1)})
    assert measured_pace([planned("a", BUNDLED), planned("b", NEW)], tmp_path) is None


def test_each_data_set_has_its_own_pace(tmp_path):
    write_bundle(tmp_path, {"a": (100.0, 1), "b": (200.0, 1), "x": (1000.0, 1), "y": (1000.0, 1)},
                 data={"x": "e", "y": "e"})
    plan = [planned("a", BUNDLED), planned("b", BUNDLED), planned("c", NEW),
            planned("x", BUNDLED, "e"), planned("y", BUNDLED, "e"), planned("z", NEW, "e"), planned("w", NEW, "e")]
    lines = measured_pace(plan, tmp_path).splitlines()
    assert lines[0].startswith("measured on d: 2 finished runs of this campaign took 150 core-seconds each")
    assert "its 1 final runs still to run take 0.0 CPU core-hours" in lines[0]
    assert lines[1].startswith("measured on e: 2 finished runs of this campaign took 1000 core-seconds each")
    assert "its 2 final runs still to run take 0.6 CPU core-hours" in lines[1]
