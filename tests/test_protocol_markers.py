"""The claims table of two protocols in the docs (``<!-- bundle-protocols: ... -->``): made of several bundles,
regenerated when any of them changes (a lane regenerates the pages that name its bundle), a protocol whose bundle
is not written yet named under the table, a stale table found by ``--check``."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_bundle_answers as built  # final runs of baseline, cog_fc, cog_ts in two draws

from mtl_cog.bundles import bundle as bundles
from mtl_cog.errors import UserError
from mtl_cog.reporting.docs_tables import pages_naming, regenerate_docs

PAPER, FAIR = "results/paper_d/bundle", "results/fair_d/bundle"


def write(site: Path, name: str, gains: dict, monkeypatch) -> None:
    monkeypatch.setattr(built, "NLL_GAIN", gains)
    bundles.write_bundle(site / name, built.make_bundle())


def page(site: Path, table: str = "claims") -> Path:
    path = site / "docs" / "r.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"# r\n\n<!-- bundle-protocols: {table} paper={PAPER} fair={FAIR} -->\nold\n"
                    "<!-- /bundle-protocols -->\n")
    return path


def test_the_claims_table_sets_both_protocols_side_by_side_with_the_surviving_share(tmp_path, monkeypatch):
    write(tmp_path, PAPER, {("cog_fc", d): 0.02 for d in ("1", "2")}, monkeypatch)
    write(tmp_path, FAIR, {("cog_fc", d): 0.005 for d in ("1", "2")}, monkeypatch)
    path = page(tmp_path)
    assert regenerate_docs(tmp_path, check=True)  # "old" is stale
    regenerate_docs(tmp_path)
    text = path.read_text()
    row = next(line for line in text.splitlines() if "COG-FC improves on the baseline | nll" in line)
    assert "| supported | -0.0200 |" in row and "| supported | -0.0050 |" in row and row.endswith("| 0.2500 |")
    assert "Not written yet" not in text and regenerate_docs(tmp_path, check=True) == []
    assert pages_naming(tmp_path, PAPER) == pages_naming(tmp_path, FAIR) == [path]  # a lane of either rewrites it


def test_a_protocol_not_written_yet_is_named_and_its_cells_stay_empty(tmp_path, monkeypatch):
    write(tmp_path, FAIR, {("cog_fc", d): 0.005 for d in ("1", "2")}, monkeypatch)
    path = page(tmp_path)
    regenerate_docs(tmp_path, only=FAIR)
    text = path.read_text()
    assert f"*Not written yet: paper ({PAPER}).*" in text
    row = next(line for line in text.splitlines() if "COG-FC improves on the baseline | nll" in line)
    assert row.startswith("| d | COG-FC improves on the baseline | nll |  |  |  | supported |")
    (tmp_path / "results/paper_d").mkdir()  # the paper lane starts: its bundle appears, the table is stale
    write(tmp_path, PAPER, {("cog_fc", d): 0.02 for d in ("1", "2")}, monkeypatch)
    assert regenerate_docs(tmp_path, check=True) == [f"docs/r.md: claims of the protocols paper={PAPER} fair={FAIR}"]


def test_the_power_table_and_a_bad_table_name(tmp_path, monkeypatch):
    write(tmp_path, PAPER, {("cog_fc", d): 0.02 for d in ("1", "2")}, monkeypatch)
    write(tmp_path, FAIR, {("cog_fc", d): 0.005 for d in ("1", "2")}, monkeypatch)
    path = page(tmp_path, "power")
    regenerate_docs(tmp_path)
    assert "| fair | d | nll | 0.0040 | 1.0000 |  | 1.0000 |  |" in path.read_text()  # zero spread: always read
    page(tmp_path, "verdicts")
    with pytest.raises(UserError, match="bundle-protocols names no table 'verdicts'"):
        regenerate_docs(tmp_path, check=True)


def test_a_table_or_figure_of_a_campaign_not_started_says_so_and_fills_in_when_its_bundle_comes(tmp_path, monkeypatch):
    path = tmp_path / "docs" / "r.md"
    path.parent.mkdir()
    path.write_text(f"<!-- bundle-table: {FAIR} summary -->\nold\n<!-- /bundle-table -->\n"
                    f"<!-- bundle-figure: {FAIR} curve figures/c.svg -->\nold\n<!-- /bundle-figure -->\n")
    regenerate_docs(tmp_path)
    assert path.read_text().count(f"*Not written yet: {FAIR} (its lane has not committed a run).*") == 2
    assert pages_naming(tmp_path, FAIR) == [path]  # its lane will rewrite the page
    write(tmp_path, FAIR, {("cog_fc", d): 0.005 for d in ("1", "2")}, monkeypatch)
    assert regenerate_docs(tmp_path, check=True) == [f"docs/r.md: summary of {FAIR}",  # the table, and the figure:
                                                     f"docs/r.md: figure figures/c.svg of {FAIR}"]  # now pending
    (tmp_path / "results/other").mkdir()  # a campaign folder without a bundle is damage, not "not yet"
    path.write_text("<!-- bundle-table: results/other/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    with pytest.raises(UserError, match="holds no results bundle"):
        regenerate_docs(tmp_path, check=True)


@pytest.mark.parametrize("named, message", [
    (f"paper={PAPER} paper={FAIR}", "'paper' is named twice"),
    (f"paper={PAPER} data={FAIR}", "'data' is no protocol"),
    (f"paper={PAPER} fair={PAPER}", "a bundle is named twice"),
])
def test_a_protocols_marker_that_one_bundle_would_silently_win_is_refused(tmp_path, monkeypatch, named, message):
    write(tmp_path, PAPER, {("cog_fc", d): 0.02 for d in ("1", "2")}, monkeypatch)
    (tmp_path / "docs").mkdir()
    text = f"<!-- bundle-protocols: claims {named} -->\nold\n<!-- /bundle-protocols -->\n"
    (tmp_path / "docs" / "r.md").write_text(text)
    with pytest.raises(UserError, match=message):
        regenerate_docs(tmp_path, check=True)


def test_a_protocols_bundle_whose_campaign_folder_holds_none_is_damage_not_pending(tmp_path, monkeypatch):
    write(tmp_path, PAPER, {("cog_fc", d): 0.02 for d in ("1", "2")}, monkeypatch)
    (tmp_path / "results" / "fair_d").mkdir(parents=True)  # e.g. a typo in the last part, or a half-synced bundle
    page(tmp_path)
    with pytest.raises(UserError, match="bundle-protocols names results/fair_d/bundle, which holds no results"):
        regenerate_docs(tmp_path, check=True)
