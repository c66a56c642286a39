"""Every results table in docs/ is generated from a committed results bundle and agrees with it."""

import re
from pathlib import Path

from mtl_cog.reporting.docs_tables import MARKER, regenerate_docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_docs_results_table_agrees_with_its_committed_bundle():
    assert regenerate_docs(ROOT, check=True) == []


def test_every_named_bundle_is_committed_with_the_project():
    for page in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        for match in MARKER.finditer(page.read_text()):
            assert (ROOT / match["bundle"] / "campaign.json").is_file(), f"{page}: {match['bundle']}"


def test_a_table_that_drifts_from_its_bundle_is_found(tmp_path):
    import shutil

    from test_campaign import write_tiny_bundle

    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "r.md"
    page.write_text("x\n<!-- bundle-table: results/c/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: summary of results/c/bundle"]
    assert regenerate_docs(tmp_path) and regenerate_docs(tmp_path, check=True) == []
    assert re.search(r"\| cog_ts \|", page.read_text())
    shutil.rmtree(tmp_path / "results")


def test_a_table_whose_runs_have_not_finished_reads_pending_and_an_unknown_one_is_refused(tmp_path):
    import pytest
    from test_campaign import write_tiny_bundle

    from mtl_cog.errors import UserError
    from mtl_cog.reporting.docs_tables import PENDING

    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")  # final runs only: no curve, no tuning
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "r.md"
    page.write_text("<!-- bundle-table: results/c/bundle curve -->\nold\n<!-- /bundle-table -->\n")
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: curve of results/c/bundle"]
    regenerate_docs(tmp_path)
    assert page.read_text() == f"<!-- bundle-table: results/c/bundle curve -->\n{PENDING}\n<!-- /bundle-table -->\n"
    assert regenerate_docs(tmp_path, check=True) == []
    page.write_text("<!-- bundle-table: results/c/bundle sumary -->\nold\n<!-- /bundle-table -->\n")
    with pytest.raises(UserError, match="names no table 'sumary'"):
        regenerate_docs(tmp_path)
