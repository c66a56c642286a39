"""The pinned controls against their counterparts (mtl_cog/analysis/protocol_controls.py): COG-FC run at the
baseline's chosen follower rate, paired seed by seed with the fair campaign's baseline."""

import pytest
import test_bundle_answers as built  # the answer tables' bundle builder (baseline, cog_fc, cog_ts; 2 draws, 3 seeds)

from mtl_cog.analysis.protocol_controls import protocol_controls
from mtl_cog.errors import UserError


def _pinned(gain: float, monkeypatch):
    """A campaign of cog_fc alone (its runs renamed: another bundle), ``gain`` lower NLL than the baseline."""
    monkeypatch.setattr(built, "NLL_GAIN", {("cog_fc", d): gain for d in ("1", "2")})
    bundle = built.make_bundle()
    keep = bundle.runs["method"] == "cog_fc"
    runs = set(bundle.runs.loc[keep, "run"])
    bundle.runs = bundle.runs[keep].assign(run=lambda r: "p-" + r["run"])
    bundle.results = bundle.results[bundle.results["run"].isin(runs)].assign(run=lambda r: "p-" + r["run"])
    bundle.campaign["specs"] = {"p-" + k: v for k, v in bundle.campaign["specs"].items() if k in runs}
    return bundle


def _rates(bundle, method, rate):
    for spec in bundle.campaign["specs"].values():
        if spec["labels"]["method"] == method:
            spec["overrides"] = [f"optim.follower_lr={rate}", "seed=0"]


def test_the_pinned_variant_is_read_against_its_counterpart_by_the_plans_rule(monkeypatch):
    fair = built.make_bundle()  # its own cog_fc: 0.02 better than the baseline
    pinned = _pinned(0.01, monkeypatch)
    _rates(fair, "baseline", "0.001")
    _rates(pinned, "cog_fc", "0.001")
    table = protocol_controls({"pinned": [pinned], "fair": [fair]}).set_index(["claim", "metric"])
    row = table.loc[("COG-FC improves on the baseline", "nll")]
    assert row["answer"] == "supported" and row["difference"] == pytest.approx(-0.01)
    assert row["fair"] == "supported" and row["fair difference"] == pytest.approx(-0.02)
    assert "COG+LS improves on label smoothing" not in table.index.get_level_values("claim")  # not pinned here


def test_a_variant_not_at_its_counterparts_setting_is_refused(monkeypatch):
    fair, pinned = built.make_bundle(), _pinned(0.01, monkeypatch)
    _rates(fair, "baseline", "0.001")
    _rates(pinned, "cog_fc", "0.002")
    with pytest.raises(UserError, match="not pinned to its counterpart's choice"):
        protocol_controls({"pinned": [pinned], "fair": [fair]})


def test_other_seeds_or_a_missing_side_are_refused(monkeypatch):
    fair, pinned = built.make_bundle(), _pinned(0.01, monkeypatch)
    for spec in pinned.campaign["specs"].values():
        spec["labels"]["seed"] += 10
    with pytest.raises(UserError, match="cannot be paired by seed"):
        protocol_controls({"pinned": [pinned], "fair": [fair]})
    with pytest.raises(UserError, match="name both pinned= and fair="):
        protocol_controls({"fair": [fair]})
