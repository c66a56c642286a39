"""Docs markers are data: a ``where`` clause is parsed by a tiny grammar and never evaluated, a marker names a
bundle under the repository's results/ only, and a marker line that opens no complete block is an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_campaign import write_tiny_bundle

from mtl_cog.cli import regenerate_docs_tables
from mtl_cog.errors import UserError
from mtl_cog.reporting.docs_tables import pages_naming, regenerate_docs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(tmp_path):
    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")
    (tmp_path / "docs").mkdir()
    return tmp_path


def page_with(site: Path, text: str) -> Path:
    page = site / "docs" / "r.md"
    page.write_text(text)
    return page


def block(head: str, body: str = "old\n") -> str:
    return f"<!-- bundle-table: {head} -->\n{body}<!-- /bundle-table -->\n"


@pytest.mark.parametrize("payload", [
    "@page.__class__('{target}').touch() == 0",
    "@path.joinpath('{target}').write_text('x') > 0",
    "__import__('pathlib').Path('{target}').touch() == 0",
    "method == 'cog_ts' or @page.__class__('{target}').touch() == 0",
])
def test_a_where_clause_that_would_run_code_is_refused_and_runs_nothing(site, payload):
    target = site / "created_by_the_page"
    page_with(site, block(f"results/c/bundle summary where {payload.format(target=target)}"))
    with pytest.raises(UserError, match="is not a filter"):
        regenerate_docs(site, check=True)
    assert not target.exists()


def test_the_grammar_reads_the_committed_clauses_and_nothing_else():
    from mtl_cog.reporting.marker_filter import Condition, parse_where

    assert parse_where("metric in ['nll', 'ece@15', 'accuracy']") == [
        Condition("metric", "in", ("nll", "ece@15", "accuracy"))]
    assert parse_where("role == 'final' and ratio != 0.1") == [Condition("role", "==", ("final",)),
                                                                 Condition("ratio", "!=", (0.1,))]
    for bad in ("metric", "metric == nll", "metric > 1", "metric == 'a' or role == 'b'", "metric in 'a'",
                "metric in ['a'", "== 'a'", "metric == 'a' and", "metric == 1e999", "x.y() == 1"):
        with pytest.raises(ValueError):
            parse_where(bad)


def test_a_filter_compares_text_and_numbers_cell_by_cell():
    from mtl_cog.reporting.marker_filter import apply_where

    frame = pd.DataFrame({"metric": ["nll", "ece@15", "accuracy"], "ratio": [0.1, 1.0, float("nan")]})
    assert list(apply_where(frame, "metric in ['nll', 'accuracy']", "p")["metric"]) == ["nll", "accuracy"]
    assert list(apply_where(frame, "ratio == 1 and metric != 'nll'", "p")["metric"]) == ["ece@15"]
    with pytest.raises(UserError, match="names no column 'nosuch'"):
        apply_where(frame, "nosuch == 'x'", "p")


def test_a_committed_clause_gives_the_table_it_gave_before(site):
    page = page_with(site, block("results/c/bundle summary where method == 'cog_ts'"))
    regenerate_docs(site)
    assert "cog_ts" in page.read_text() and "| baseline |" not in page.read_text()
    assert regenerate_docs(site, check=True) == []


@pytest.mark.parametrize("bundle", ["../outside/bundle", "/tmp/bundle", "results/../outside/bundle", "results"])
def test_a_marker_names_a_bundle_under_results_only(site, bundle):
    write_tiny_bundle(site / "outside" / "bundle")
    page_with(site, block(f"{bundle} summary"))
    with pytest.raises(UserError, match="under the repository's results/"):
        regenerate_docs(site, check=True)


@pytest.mark.parametrize("text, line", [
    ("intro\n<!-- bundle-table: results/c/bundle summary -->\nnever closed\n", 2),  # unclosed: never checked
    ("<!-- bundle-tabel: results/c/bundle summary -->\nx\n<!-- /bundle-tabel -->\n", 1),  # unknown kind
    ("x\n\n<!-- /bundle-table -->\n", 3),  # a closer without its opener
    ("<!-- bundle-table: results/c/bundle summary -->\n<!-- bundle-table: results/c/bundle summary -->\nx\n"
     "<!-- /bundle-table -->\n", 1),  # an opener inside another block
])
def test_a_marker_line_of_no_complete_block_is_refused_naming_its_line(site, text, line):
    page_with(site, text)
    with pytest.raises(UserError, match=rf"r\.md:{line}: .*no complete bundle-table, bundle-figure or"):
        regenerate_docs(site, check=True)


def test_a_marker_quoted_in_prose_is_no_marker(site):
    page_with(site, "Write `<!-- bundle-table: results/<campaign>/bundle <table> [where <filter>] -->` above.\n")
    assert regenerate_docs(site, check=True) == [] and pages_naming(site, "results/c/bundle") == []


def cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtl_cog.cli.regenerate_docs_tables", "--root", str(site), *args],
                          capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("clause, args, said, launched", [
    # one real launch (the entry point, its exit code and stderr as a shell sees them); the rest in this process
    ("", ("--check", "--only", "results/nosuch/bundle"), "--only results/nosuch/bundle: no docs block names it", True),
    ("", ("--check", "--pages-of", "results/nosuch/bundle"), "--pages-of results/nosuch/bundle: no docs block names",
     False),
    ("", ("--only", "results/c/bundle", "--pages-of", "results/c/bundle"), "--only and --pages-of: give one", False),
    (" where nosuch == 'x'", ("--check",), "names no column 'nosuch'", False),
    (" where __import__('os').system('true') == 0", ("--check",), "is not a filter", False),
])
def test_the_command_ends_with_one_error_line_and_exit_2(site, clause, args, said, launched, in_process):
    page_with(site, block(f"results/c/bundle summary{clause}"))
    done = cli(site, *args) if launched else in_process(regenerate_docs_tables, "--root", site, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and said in done.stderr and "Traceback" not in done.stderr
