"""A campaign that ran one draw of several (``reproduce --draws N --only-draw K``) gives per-draw readings, never
an answer: the plan's rule needs every draw (``mtl_cog/analysis/bundle_answers.py``, ``one_draw_of``)."""

from __future__ import annotations

import pandas as pd
import pytest

from mtl_cog.analysis.bundle_answers import ONE_DRAW, claims, one_draw_of, verdicts
from mtl_cog.analysis.protocol_asymmetry import combined_bundle
from mtl_cog.bundles import bundle as bundles


@pytest.mark.parametrize("command, expected", [
    (["scripts/reproduce.py", "--draws", "2", "--only-draw", "1"], (1, 2)),
    (["scripts/reproduce.py", "--only-draw=2", "--draws=3"], (2, 3)),
    (["scripts/reproduce.py", "--draws", "2"], None),  # the whole design
    (["scripts/reproduce.py", "--draws", "1", "--only-draw", "1"], None),  # a design of one draw is whole
    (["scripts/reproduce.py", "--draws", "2", "--only-draw", "1", "--only-draw", "2"], (2, 2)),  # the last counts
    ([], None),
])
def test_one_draw_of_reads_the_recorded_command(command, expected):
    assert one_draw_of({"command": command}) == expected


def one_draw_bundle(command: list[str]) -> bundles.Bundle:
    """Draw 1 only: COG-FC's NLL 0.01 below the baseline's on every seed (a 'supported' reading)."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "command": command})
    for method, shift in (("baseline", 0.0), ("cog_fc", -0.01)):
        for seed in (0, 1, 2):
            run = f"d-{method}-seed{seed}"
            row = {c: "" for c in bundles.RUN_COLUMNS} | {
                "run": run, "campaign": "c", "data": "d", "method": method, "role": "final", "draw": "1",
                "seed": seed, "status": "done", "config_digest": "x"}
            results = [{"run": run, "split": "test", "task": task, "metric": metric,
                        "value": base + (shift if metric == "nll" else 0.0) + 0.001 * seed}
                       for task in ("a", "mean") for metric, base in (("accuracy", 0.9), ("nll", 0.3))]
            bundle.add_run(row, pd.DataFrame(results), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    return bundle


def test_one_draw_of_two_reads_no_answer_and_keeps_the_draws_reading():
    whole = claims(one_draw_bundle(["reproduce.py", "--draws", "1"])).set_index(["claim", "metric"])
    part = claims(one_draw_bundle(["reproduce.py", "--draws", "2", "--only-draw", "1"])).set_index(["claim", "metric"])
    key = ("COG-FC improves on the baseline", "nll")
    assert whole.loc[key, "answer"] == "supported"
    assert part.loc[key, "answer"] == f"{ONE_DRAW} (draw 1 of 2 alone)"
    assert part.loc[key, "draw 1"] == whole.loc[key, "draw 1"] and part.loc[key, "draw 1"].startswith("supported")
    # a pair with no runs at all is still incomplete, not "no answer"
    assert part.loc[("COG+LS improves on label smoothing", "nll"), "answer"].startswith("incomplete")


def test_the_verdicts_and_a_combined_bundle_keep_the_rule():
    part = one_draw_bundle(["reproduce.py", "--draws", "2", "--only-draw", "1"])
    paired = pd.DataFrame([{"dataset": "d", "draw": "1", "variant": "cog_fc", "counterpart": "baseline",
                            "metric": "nll", "better": "variant"}])
    assert verdicts(paired, bundle=part).loc[0, "status"] == ONE_DRAW
    mixed = combined_bundle([(part, ("baseline", "cog_fc"))], "d", {"cog_fc": "baseline"}, "mixed")
    table = claims(mixed).set_index(["claim", "metric"])
    assert table.loc[("COG-FC improves on the baseline", "nll"), "answer"] == f"{ONE_DRAW} (draw 1 of 2 alone)"
