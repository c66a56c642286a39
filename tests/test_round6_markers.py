"""Issue 58, family 3: one marker grammar for the generator and the audit. A line that looks like a docs marker (any
indentation, a BOM, other spacing or case) is a marker or refused in one line naming page and line; a quoted literal
cannot end a marker; reading is linear; the numbers of an "In short" section are checked against the page's tables."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_campaign import write_tiny_bundle

from mtl_cog.errors import UserError
from mtl_cog.reporting.docs_tables import regenerate_docs

REPO = Path(__file__).resolve().parents[1]
AUDIT = REPO / "scripts" / "audit_claims.py"
APPENDIX = REPO / "docs" / "results" / "overconfident_appendix.md"
CURVE = "results/overconfident_curve_cog_fc/bundle"
CURVE_HEAD = f"<!-- bundle-table: {CURVE} curve_paired where metric in ['nll', 'ece@15', 'accuracy'] -->"


def audit(page: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(AUDIT), str(page), "--root", str(REPO)], capture_output=True,
                          text=True, timeout=60)


def curve_block() -> str:
    """The committed appendix's curve_paired block of the COG-FC curve, marker to closer."""
    text = APPENDIX.read_text()
    start = text.index(CURVE_HEAD)
    return text[start:text.index("<!-- /bundle-table -->", start) + len("<!-- /bundle-table -->\n")]


@pytest.fixture
def site(tmp_path):
    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")
    (tmp_path / "docs").mkdir()
    return tmp_path


NEAR_MISSES = [
    " <!-- bundle-table: results/c/bundle summary -->",  # indented: renders as the same hidden comment
    "   <!-- bundle-table: results/c/bundle summary -->",
    "\t<!-- bundle-table: results/c/bundle summary -->",
    "\ufeff<!-- bundle-table: results/c/bundle summary -->",  # a byte-order mark
    "<!--  bundle-table: results/c/bundle summary -->",  # two spaces
    "<!--bundle-table: results/c/bundle summary -->",
    "<!-- bundle-table:  results/c/bundle summary -->",
    "<!-- Bundle-table: results/c/bundle summary -->",  # case
    "<!-- BUNDLE-TABLE: results/c/bundle summary -->",
    "<!-- bundle-table: results/c/bundle summary  -->",
    "<!-- bundle-table: results/c/bundle summary -->  ",
    "<!-- bundle-table : results/c/bundle summary -->",
]


@pytest.mark.parametrize("opener", NEAR_MISSES)
def test_the_generator_refuses_a_near_miss_marker_naming_page_and_line(site, opener):
    (site / "docs" / "r.md").write_text(f"# Page\n\n{opener}\n| x |\n|---|\n| 0.99 |\n<!-- /bundle-table -->\n")
    with pytest.raises(UserError, match=r"r\.md:3: ") as err:
        regenerate_docs(site, check=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("closer", ["<!-- /Bundle-table -->", " <!-- /bundle-table -->", "<!--  /bundle-table -->",
                                    "<!-- / bundle-table -->", "\ufeff<!-- /bundle-table -->"])
def test_a_near_miss_closer_is_refused_too(site, closer):
    regenerate_docs(site)  # nothing yet
    (site / "docs" / "r.md").write_text(f"<!-- bundle-table: results/c/bundle summary -->\nold\n{closer}\n"
                                        "<!-- /bundle-table -->\n")
    with pytest.raises(UserError, match=r"r\.md:3: "):
        regenerate_docs(site, check=True)


@pytest.mark.parametrize("opener", [NEAR_MISSES[0], NEAR_MISSES[3], NEAR_MISSES[4], NEAR_MISSES[7]])
def test_the_audit_refuses_a_near_miss_marker_naming_page_and_line(tmp_path, opener):
    # the marker spelled as the near miss spells it: its prefix, spacing and case
    head = opener.replace("results/c/bundle summary", f"{CURVE} curve_paired where metric in ['nll', 'ece@15', "
                                                      "'accuracy']")
    block = curve_block().replace(CURVE_HEAD, head)
    (tmp_path / "page.md").write_text(f"# Page\n\n{block}")
    done = audit(tmp_path / "page.md")
    assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "page.md:3" in done.stderr


def test_a_quoted_literal_cannot_end_a_marker_for_either_reader(tmp_path):
    whole = audit_numbers(tmp_path, curve_block())
    quoted = curve_block().replace("'accuracy'] -->", "'accuracy'] and method != 'a > b' -->")
    assert audit_numbers(tmp_path, quoted) == whole  # the same block, every number of it audited
    from mtl_cog.reporting import docs_markers

    blocks = docs_markers.read_blocks(quoted, tmp_path / "page.md")
    assert len(blocks) == 1 and blocks[0].head.endswith("and method != 'a > b'")
    unclosed = curve_block().replace("'accuracy'] -->", "'accuracy'] and method != 'a -->")
    with pytest.raises(UserError, match=r"page\.md:1: "):
        docs_markers.read_blocks(unclosed, tmp_path / "page.md")
    (tmp_path / "page.md").write_text(unclosed)
    done = audit(tmp_path / "page.md")
    assert done.returncode == 2 and "page.md:1" in done.stderr, done.stdout + done.stderr


def audit_numbers(tmp_path: Path, text: str) -> int:
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md")
    assert done.returncode == 0, done.stdout + done.stderr
    return int(re.match(r"audited (\d+) numbers", done.stdout)[1])


def test_the_generator_and_the_audit_share_one_reader_of_blocks():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from claims_audit import page
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from mtl_cog.reporting import docs_markers, docs_tables

    assert page.read_blocks is docs_markers.read_blocks and docs_tables.read_blocks is docs_markers.read_blocks


def test_reading_is_linear_on_a_long_page_of_unclosed_markers(site, tmp_path):
    unclosed = "<!-- bundle-table: results/c/bundle summary -->\n| a |\ntext\n" * 10_000  # 30,000 lines
    closed = "<!-- bundle-table: results/c/bundle summary -->\n| a |\n<!-- /bundle-table -->\n" * 10_000
    (site / "docs" / "r.md").write_text(unclosed)
    began = time.monotonic()
    with pytest.raises(UserError, match=r"r\.md:1: "):
        regenerate_docs(site, check=True)
    assert time.monotonic() - began < 2
    (tmp_path / "long.md").write_text(unclosed)
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(AUDIT), str(tmp_path / "long.md"), "--root", str(site)],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 2 and "long.md:1" in done.stderr and time.monotonic() - began < 10, done.stderr
    from mtl_cog.reporting import docs_markers

    began = time.monotonic()
    assert len(docs_markers.read_blocks(closed, site / "docs" / "r.md")) == 10_000
    assert time.monotonic() - began < 2


def in_short_page(number: str) -> str:
    return (f"# Page\n\n## In short\n\n- The gap at a ratio of 0.01 is {number} in NLL.\n\n## Tables\n\n"
            + curve_block())


def test_a_number_in_short_is_checked_against_the_generated_tables(tmp_path):
    rows = [line.split("|") for line in curve_block().splitlines() if line.startswith("| 0.")]
    cell = rows[0][4].strip()  # a mean_difference the table prints
    (tmp_path / "page.md").write_text(in_short_page(cell))
    done = audit(tmp_path / "page.md")
    assert done.returncode == 0, done.stdout + done.stderr
    changed = f"{float(cell) + 0.0371:+.3f}"
    for spelled in (changed, changed.replace("-", "\u2212")):
        (tmp_path / "page.md").write_text(in_short_page(spelled))
        done = audit(tmp_path / "page.md")
        assert done.returncode == 1 and "page.md:5" in done.stdout and spelled in done.stdout, done.stdout


def test_a_non_utf8_page_is_one_error_line_for_the_generator(site):
    (site / "docs" / "r.md").write_bytes("<!-- bundle-table: results/c/bundle summary -->\n\xe9\n".encode("latin-1"))
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.regenerate_docs_tables", "--root", str(site), "--check"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "r.md" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
