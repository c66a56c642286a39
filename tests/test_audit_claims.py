"""scripts/audit_claims.py, the independent audit of a claims page against its bundles: the committed page audits
clean, a changed number or reading is caught and named, and bad input is one ``error:`` line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "audit_claims.py"
PAGE = Path("docs/results/overconfident.md")
CLAIMS_MARKER = "<!-- bundle-protocols: claims "


def audit(*args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def with_claims_cell_changed(column: str, change) -> tuple[str, str]:
    """The page's text with the first claims row whose ``column`` cell ``change`` rewrites (None: skip the row)
    changed, and the new cell."""
    lines = (REPO / PAGE).read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(CLAIMS_MARKER))
    header = [c.strip() for c in lines[start + 1].strip().strip("|").split("|")]
    position = header.index(column)
    for i in range(start + 3, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = lines[i].strip().strip("|").split("|")
        new = change(cells[position].strip())
        if new is not None:
            cells[position] = f" {new} "
            lines[i] = "|" + "|".join(cells) + "|\n"
            return "".join(lines), new
    raise AssertionError(f"no claims row has a {column!r} cell to change")


def shifted(cell: str) -> str | None:
    """A number moved by far more than its rounding (the page prints 4 decimals)."""
    try:
        return f"{float(cell) + 0.01:.4f}"
    except ValueError:
        return None


def turned(cell: str) -> str | None:
    """A reading turned into another."""
    readings = ("supported", "contradicted", "depends on the tuning draw", "inconclusive at this scale")
    return None if cell not in readings else "supported" if cell == "contradicted" else "contradicted"


def test_the_committed_page_audits_clean():
    done = audit(PAGE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.endswith(f"in {PAGE}: all match\n")
    assert done.stdout.startswith("audited ") and not done.stderr


def test_a_changed_number_is_caught(tmp_path):
    text, new = with_claims_cell_changed("fair difference", shifted)
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 mismatch(es)" in done.stdout
    assert f"fair difference: page {new}, bundles " in done.stdout


def test_a_changed_reading_is_caught(tmp_path):
    text, new = with_claims_cell_changed("fair", turned)
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"fair: page '{new}', bundles '" in done.stdout


def test_bad_input_is_one_error_line(tmp_path):
    (tmp_path / "plain.md").write_text("# A page\n\nNo generated tables here.\n")
    (tmp_path / "elsewhere.md").write_text("<!-- bundle-table: results/no_such_lane/bundle regime_gate -->\n"
                                           "| setting | rule |\n|---|---|\n<!-- /bundle-table -->\n")
    expected = {"missing.md": "error: page not found", "plain.md": "has no bundle-protocols or bundle-table markers",
                "elsewhere.md": "error: bundle file not found"}
    for name, words in expected.items():
        done = audit(tmp_path / name, "--root", REPO)
        assert done.returncode == 2 and not done.stdout, (name, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and words in done.stderr, name
