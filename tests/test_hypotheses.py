"""The hypotheses are data (``configs/hypotheses/cog_paper.yaml``, read by ``mtl_cog/analysis/hypotheses.py``): the
claims machinery reads them from the file, and a damaged file is one error naming it and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtl_cog.analysis import hypotheses
from mtl_cog.analysis.bundle_answers import paper_claims
from mtl_cog.analysis.protocol_answers import claimed_gains, power_claims
from mtl_cog.analysis.protocol_asymmetry import shared_studies
from mtl_cog.analysis.protocol_controls import controls
from mtl_cog.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def test_the_tables_read_the_claims_from_the_file():
    data = yaml.safe_load(hypotheses.HYPOTHESES_FILE.read_text())
    assert [c[:3] for c in paper_claims()] == [(r["claim"], r["variant"], r["counterpart"]) for r in data["claims"]]
    assert claimed_gains() == {"COG-FC improves on the baseline", "COG+LS improves on label smoothing"}
    assert [p[0] for p in power_claims()] == ["H1", "H2", "H3"] and shared_studies() == ("cog_fc", "cog_ts")
    assert {v: keys for v, (_, keys) in controls().items()} == {
        "cog_fc": ("optim.follower_lr",), "cog_ls": ("optim.follower_lr", "method.label_smoothing")}


def test_no_library_module_names_a_campaigns_claims():
    """The claims' wording lives in the data file only (the audit restates it on purpose: it is outside mtl_cog)."""
    texts = [claim for claim, *_ in paper_claims()]
    hits = [f"{p.relative_to(REPO)}: {t}" for p in (REPO / "mtl_cog").rglob("*.py") for t in texts
            if t in p.read_text()]
    assert hits == []


@pytest.mark.parametrize("change, key", [
    (lambda d: d.pop("claims"), "claims"),
    (lambda d: d["claims"][0].pop("variant"), "claims[0]"),
    (lambda d: d["claims"][1].update(winner="both"), "claims[1].winner"),
    (lambda d: d["claims"][1].update(variant="cog_fc"), "claims"),
    (lambda d: d.update(metrics="nll"), "metrics"),
    (lambda d: d["readings"].update(power=["H9"]), "readings.power"),
    (lambda d: d["readings"].update(controls={"H1": "optim.follower_lr"}), "readings.controls"),
    (lambda d: d["readings"].update(extra=[]), "readings"),
])
def test_a_damaged_file_is_one_error_naming_the_key(tmp_path, change, key):
    data = yaml.safe_load(hypotheses.HYPOTHESES_FILE.read_text())
    change(data)
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=rf"h\.yaml: {key.replace('[', '.').replace(']', '.')}"):
        hypotheses.load_hypotheses(path)


def test_an_unreadable_or_broken_file_is_one_error(tmp_path):
    with pytest.raises(UserError, match="cannot be read"):
        hypotheses.load_hypotheses(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("claims: [\n")
    with pytest.raises(UserError, match=r"bad\.yaml: \(syntax\)"):
        hypotheses.load_hypotheses(tmp_path / "bad.yaml")
