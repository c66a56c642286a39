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


def with_claims_cell_changed(column: str, change, marker: str = CLAIMS_MARKER) -> tuple[str, str]:
    """The page's text with the first row of the block under ``marker`` whose ``column`` cell ``change`` rewrites
    (None: skip the row) changed, and the new cell."""
    lines = (REPO / PAGE).read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(marker))
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
    first, *rest = done.stdout.splitlines()
    assert first.startswith("audited ") and first.endswith(f"in {PAGE}: all match") and not done.stderr
    assert len(rest) == 1 and rest[0].startswith("not audited: ") and "summary ×" in rest[0]  # named, not hidden
    assert "asymmetry" not in rest[0] and "claims" not in rest[0]


def with_appendix(tmp_path: Path) -> None:
    """The page's appendix beside its copy: the numbers of its "In short" are checked against the tables of both."""
    (tmp_path / "page_appendix.md").write_text((REPO / PAGE).with_name("overconfident_appendix.md").read_text())


def test_a_changed_number_is_caught(tmp_path):
    text, new = with_claims_cell_changed("fair difference", shifted)
    (tmp_path / "page.md").write_text(text)
    with_appendix(tmp_path)
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


def test_a_changed_asymmetry_number_is_caught(tmp_path):
    """The paper's tuning asymmetry pairs two bundles (fair COG against the paper's untuned baseline): audited too."""
    text, new = with_claims_cell_changed("difference", shifted, "<!-- bundle-protocols: asymmetry ")
    (tmp_path / "page.md").write_text(text)
    with_appendix(tmp_path)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1 and "1 mismatch(es)" in done.stdout, done.stdout + done.stderr
    assert f"asymmetry: fashion_mnist, COG-FC improves on the baseline, nll: difference: page {new}" in done.stdout


def test_a_changed_curve_verdict_is_caught(tmp_path):
    """The leader-rate curve's paired table (quoted in the page's short answer) is re-derived too."""
    appendix = (REPO / PAGE).with_name("overconfident_appendix.md")
    marker = "<!-- bundle-table: results/overconfident_curve_cog_fc/bundle curve_paired "
    lines = appendix.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith(marker)) + 3
    assert "| counterpart |" in lines[row], lines[row]
    lines[row] = lines[row].replace("| counterpart |", "| variant |")
    (tmp_path / "overconfident.md").write_text((REPO / PAGE).read_text())
    (tmp_path / "overconfident_appendix.md").write_text("".join(lines))
    done = audit(tmp_path / "overconfident.md", "--root", REPO)
    assert done.returncode == 1 and "1 mismatch(es)" in done.stdout, done.stdout + done.stderr
    assert "curve_paired: cog_fc at 0.0100 − baseline, nll: better: page 'variant', bundles 'counterpart'" \
        in done.stdout, done.stdout


def test_bad_input_is_one_error_line(tmp_path):
    (tmp_path / "plain.md").write_text("# A page\n\nNo generated tables here.\n")
    (tmp_path / "results" / "lane_without_bundle").mkdir(parents=True)  # its folder exists: damage, not 'not yet'
    (tmp_path / "elsewhere.md").write_text("<!-- bundle-table: results/lane_without_bundle/bundle regime_gate -->\n"
                                           "| setting | rule |\n|---|---|\n<!-- /bundle-table -->\n")
    expected = {"missing.md": "error: page not found", "plain.md": "has no bundle-protocols or bundle-table markers",
                "elsewhere.md": "error: bundle file not found"}
    for name, words in expected.items():
        done = audit(tmp_path / name, "--root", tmp_path)
        assert done.returncode == 2 and not done.stdout, (name, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and words in done.stderr, name


def test_a_coarser_number_is_caught(tmp_path):
    """The page's own precision is no licence: '0' for -0.0043 is a mismatch, not a match within ± 0.5."""
    text, new = with_claims_cell_changed("fair difference", lambda c: "0" if c else None)
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1 and f"fair difference: page {new}, bundles " in done.stdout, done.stdout


def test_a_dropped_or_repeated_row_is_caught(tmp_path):
    lines = (REPO / PAGE).read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith(CLAIMS_MARKER)) + 3
    for name, changed in {"dropped": lines[:first] + lines[first + 1:],
                          "repeated": lines[:first + 1] + lines[first:]}.items():
        (tmp_path / "page.md").write_text("".join(changed))
        done = audit(tmp_path / "page.md", "--root", REPO)
        assert done.returncode == 1, (name, done.stdout)
        assert ("(missing)" if name == "dropped" else "'repeated'") in done.stdout, (name, done.stdout)


def test_a_column_no_check_reads_is_caught(tmp_path):
    text = (REPO / PAGE).read_text().replace(" surviving share |", " surviving share | verdict |", 1)
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1 and "column 'verdict'" in done.stdout, done.stdout


def test_unreadable_pages_are_one_error_line(tmp_path):
    (tmp_path / "latin.md").write_bytes((REPO / PAGE).read_text().encode("latin-1", "replace"))
    for page, words in {tmp_path / "latin.md": "cannot read", tmp_path: "not a file"}.items():
        done = audit(page, "--root", REPO)
        assert done.returncode == 2 and not done.stdout and done.stderr.startswith("error: ") \
            and words in done.stderr and done.stderr.count("\n") == 1, (page, done.stdout, done.stderr)


def test_a_block_kind_no_check_knows_is_caught(tmp_path):
    text = (REPO / PAGE).read_text().replace(CLAIMS_MARKER, "<!-- bundle-protocols: claim ", 1)
    (tmp_path / "page.md").write_text(text)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1 and "a kind no check reads" in done.stdout, done.stdout


def tiny_bundle(path: Path, values: dict[tuple[str, str], float]) -> Path:
    """A two-seed, one-draw bundle of baseline and COG-FC final runs with test NLL per (run, task)."""
    import json

    import pandas as pd

    runs = [f"{method}-seed{seed}" for method in ("baseline", "cog_fc") for seed in (0, 1)]
    path.mkdir(parents=True)
    pd.DataFrame({"run": runs, "data": "toy", "method": [r.split("-")[0] for r in runs], "role": "final",
                  "draw": 1, "ratio": None, "seed": [int(r[-1]) for r in runs], "status": "done"}
                 ).to_csv(path / "runs.csv", index=False)
    pd.DataFrame([{"run": run, "task": task, "split": "test", "metric": "nll", "value": value}
                  for (run, task), value in values.items()]).to_csv(path / "results.csv.gz", index=False)
    specs = {r: {"labels": {"role": "final", "method": r.split("-")[0], "draw": 1, "seed": int(r[-1]), "data": "toy"},
                 "overrides": []} for r in runs}
    (path / "campaign.json").write_text(json.dumps({"specs": specs}))
    return path


def test_bundle_values_the_project_would_refuse_are_refused(tmp_path, monkeypatch):
    """A non-finite value ends the audit (bad input); a task row missing leaves that run's task mean undefined
    rather than a mean over fewer tasks, so the run drops out of the pair instead of moving it."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from claims_audit.bundle import AuditError, Bundle
    from claims_audit.rule import Draw, answer

    runs = [f"{method}-seed{seed}" for method in ("baseline", "cog_fc") for seed in (0, 1)]
    values = {(run, task): 0.3 + 0.1 * i for i, run in enumerate(runs) for task in ("a", "b")}
    bundle = Bundle(tiny_bundle(tmp_path / "whole", values))
    assert bundle.pair("cog_fc", "baseline", "nll", 1, -1).n == 2
    del values[("cog_fc-seed1", "b")]
    short = Bundle(tiny_bundle(tmp_path / "short", values)).pair("cog_fc", "baseline", "nll", 1, -1)
    assert (short.n, short.planned) == (1, 2) and short.reading == "no interval (one seed)"
    values[("cog_fc-seed1", "b")] = float("nan")
    try:
        Bundle(tiny_bundle(tmp_path / "nan", values))
        raise AssertionError("a NaN value was averaged")
    except AuditError as err:
        assert "not finite" in str(err)
    nothing = Draw(0, 5, float("nan"), *[float("nan")] * 3, "", False)
    assert answer({1: nothing, 2: nothing}, scored=False) == ""  # no final run in the table: no row to answer
    assert answer({1: nothing, 2: nothing}) == "incomplete (draw 1 missing, draw 2 missing)"
    assert answer({1: bundle.pair("cog_fc", "baseline", "nll", 1, -1), 2: nothing}) == "incomplete (draw 2 missing)"


def test_where_clauses_are_read_as_the_generator_reads_them(monkeypatch):
    """A marker's filter (==, !=, in, joined by and; numbers compare by value) narrows the rows expected; a clause
    outside the grammar or on a column the audit does not key on is refused, never ignored."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from claims_audit.page import kept

    key = ("arm", "ratio", "metric")
    rows = [(arm, ratio, metric) for arm, ratio in (("baseline", ""), ("cog_fc", "0.0100"), ("cog_fc", "1.0000"))
            for metric in ("nll", "ece@15", "brier")]
    assert kept("bundle-table: b curve", key, rows) == set(rows)
    assert kept("bundle-table: b curve where metric == 'nll'", key, rows) == {r for r in rows if r[2] == "nll"}
    narrowed = kept("x where metric in ['nll', 'brier'] and arm != 'baseline' and ratio == 0.01", key, rows)
    assert narrowed == {("cog_fc", "0.0100", "nll"), ("cog_fc", "0.0100", "brier")}
    for clause in ("x where metric = 'nll'", "x where n_seeds == 3", "x where metric == 'nll' or arm == 'a'"):
        try:
            kept(clause, key, rows)
            raise AssertionError(f"{clause!r} was accepted")
        except ValueError:
            pass


def test_a_bundle_file_unlike_its_seal_is_refused(tmp_path):
    """A bundle whose file no longer has the SHA-256 its manifest.json sealed is bad input (exit 2), as it is to the
    project's loader: a hand-edited runs.csv is never audited."""
    import shutil

    bundle = "results/overconfident_curve_cog_fc/bundle"
    shutil.copytree(REPO / bundle, tmp_path / bundle)
    appendix = (REPO / PAGE).with_name("overconfident_appendix.md").read_text()
    start = appendix.index(f"<!-- bundle-table: {bundle} curve_paired ")
    (tmp_path / "page.md").write_text(appendix[start:appendix.index("<!-- /bundle-table -->", start) + 22] + "\n")
    assert audit(tmp_path / "page.md", "--root", tmp_path).returncode == 0
    with open(tmp_path / bundle / "runs.csv", "a") as runs:
        runs.write("\n")
    done = audit(tmp_path / "page.md", "--root", tmp_path)
    assert done.returncode == 2 and not done.stdout and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert "runs.csv: not the file manifest.json sealed" in done.stderr, done.stderr


def test_figures_and_bundles_not_written_yet_are_named_not_failed(tmp_path):
    figure = ("<!-- bundle-figure: results/x/bundle curve figures/x.svg where metric == 'nll' -->\n"
              "![curve](figures/x.svg)\n<!-- /bundle-figure -->\n")
    pending = ("<!-- bundle-table: results/no_lane_yet/bundle curve -->\n"
               "*Not written yet: results/no_lane_yet/bundle (its lane has not committed a run).*\n"
               "<!-- /bundle-table -->\n")
    (tmp_path / "page.md").write_text(f"# A page\n\n{figure}\n{pending}")
    done = audit(tmp_path / "page.md", "--root", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "figure ×1" in done.stdout and "not written yet ×1" in done.stdout
    (tmp_path / "page.md").write_text(pending.replace("*Not written", "| arm |\n|---|\n| baseline |\n*Not written"))
    done = audit(tmp_path / "page.md", "--root", tmp_path)
    assert done.returncode == 1 and "rows of a bundle not written yet: page 'present'" in done.stdout, done.stdout


def test_an_answer_read_from_one_draw_of_two_is_caught(tmp_path):
    """A campaign that ran one draw of two (``--only-draw``) has no answer: its draw's reading written as one is a
    mismatch, found from the command the bundle records."""
    marker = "<!-- bundle-table: results/overconfident_paper_constant_fashion_mosaic_d1/bundle claims "
    text, new = with_claims_cell_changed("answer", lambda c: "supported" if c.startswith("no answer") else None,
                                         marker)
    (tmp_path / "page.md").write_text(text)
    with_appendix(tmp_path)
    done = audit(tmp_path / "page.md", "--root", REPO)
    assert done.returncode == 1 and "1 mismatch(es)" in done.stdout, done.stdout + done.stderr
    assert "answer: page 'supported', bundles 'no answer (draw 1 of 2 alone)'" in done.stdout
