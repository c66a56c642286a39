"""The results tables of ``docs/``: each generated from a committed results bundle, between markers.

A results table in docs/ sits between these markers and is generated from a committed bundle::

    <!-- bundle-table: results/<campaign>/bundle <table> [where <pandas query>] -->
    ... the table, as bundle_report.markdown_of writes it ...
    <!-- /bundle-table -->

``scripts/regenerate_docs_tables.py`` rewrites them (``regenerate_docs``), a lane does so for its bundle with
every commit, and ``tests/test_results_docs.py`` fails when a page disagrees with its bundle.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from mtl_cog.errors import UserError
from mtl_cog.io import atomic_write_text
from mtl_cog.reporting.bundle import read_bundle
from mtl_cog.reporting.bundle_report import TABLE_NAMES, bundle_tables, markdown_of

# A block may name a table its bundle does not have *yet* (one of TABLE_NAMES whose runs have not finished: the
# summary before any final run, a curve before its lane ran): it reads PENDING until they exist, so a page can be
# laid out before its campaign ends and the lanes fill it in. A name no bundle can have is an error.
PENDING = "*Not in the bundle yet: the runs this table is made of have not finished.*"
MARKER = re.compile(r"<!-- bundle-table: (?P<bundle>\S+) (?P<table>\w+)(?: where (?P<query>.+?))? -->\n"
                    r"(?P<body>.*?)<!-- /bundle-table -->", re.DOTALL)


def _docs_pages(root: Path) -> list[Path]:
    return [p for p in sorted([*(root / "docs").rglob("*.md"), root / "README.md"]) if p.is_file()]


def pages_naming(root: Path, bundle: str) -> list[Path]:
    """The docs pages (and README) with a bundle-table block of ``bundle`` (as the markers name it)."""
    return [p for p in _docs_pages(root) if any(m["bundle"] == bundle for m in MARKER.finditer(p.read_text()))]


def regenerate_docs(root: Path, check: bool = False, only: str | None = None) -> list[str]:
    """Rewrite every bundle-table block under ``root/docs`` (and the README) from its bundle; with ``check``,
    write nothing; with ``only`` (a bundle as the markers name it), the blocks of that bundle alone.
    -> the blocks that disagreed with their bundle (``file: table``)."""
    stale, cache = [], {}
    for page in _docs_pages(root):
        text = page.read_text()

        def table_for(match: re.Match, page: Path = page) -> str:
            if only is not None and match["bundle"] != only:
                return match.group(0)
            path = root / match["bundle"]
            if path not in cache:
                bundle = read_bundle(path)
                if bundle is None:
                    raise UserError(f"{page}: bundle-table names {match['bundle']}, which holds no results bundle.")
                cache[path] = bundle_tables(bundle)
            tables = cache[path]
            if match["table"] not in TABLE_NAMES:
                raise UserError(f"{page}: bundle-table names no table {match['table']!r} "
                                f"(a bundle's tables: {', '.join(TABLE_NAMES)}).")
            frame = tables.get(match["table"], pd.DataFrame())
            if not frame.empty and match["query"]:
                frame = frame.query(match["query"])
            body = PENDING + "\n" if frame.empty else markdown_of(frame.reset_index(drop=True)) + "\n"
            if body != match["body"]:
                stale.append(f"{page.relative_to(root)}: {match['table']} of {match['bundle']}")
            head = match.group(0)[: match.start("body") - match.start(0)]
            return f"{head}{body}<!-- /bundle-table -->"

        new = MARKER.sub(table_for, text)
        if new != text and not check:
            atomic_write_text(page, new)
    return stale
