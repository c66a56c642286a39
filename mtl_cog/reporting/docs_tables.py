"""The results tables of ``docs/``: each generated from a committed results bundle, between markers.

A results table in docs/ sits between these markers and is generated from a committed bundle::

    <!-- bundle-table: results/<campaign>/bundle <table> [where <filter>] -->
    ... the table, as bundle_report.markdown_of writes it ...
    <!-- /bundle-table -->

A block may name a bundle whose campaign folder does not exist yet (a lane not started): it reads "Not written
yet" with the bundle's name, so a page is laid out before its campaigns run, and each lane fills in its blocks.

A figure (a leader-rate curve: one metric of one data set against the ratio) is an SVG file next to the page,
drawn from the same table, and linked between markers of its own::

    <!-- bundle-figure: results/<campaign>/bundle curve figures/<name>.svg where metric == 'nll' -->
    ![...](figures/<name>.svg)
    <!-- /bundle-figure -->

The paper's claims under two protocols (``protocol_answers``: ``claims``, ``power`` or ``secondary``;
``protocol_asymmetry``: ``asymmetry``) are made of
several bundles, one per protocol and data set, named per protocol (a bundle not written yet leaves its protocol's
cells empty and is named under the table)::

    <!-- bundle-protocols: claims paper=results/<a>/bundle,results/<b>/bundle fair=results/<c>/bundle [where ...] -->
    ...
    <!-- /bundle-protocols -->

A marker is data: the bundle must lie under the repository's ``results/``, the filter is the tiny grammar of
``marker_filter`` (``column == 'x'``, ``!=``, ``in [...]``, joined by ``and``), never evaluated. Where a block starts
and ends is read by ``docs_markers``, the reading ``scripts/audit_claims.py`` shares: a line that looks like a
marker (any indentation, byte-order mark, spacing or case) and opens or closes no block is an error naming page and
line, so no block goes unchecked by one reader and read by the other.

The SVG is text written by ``svg_charts`` (no timestamp, no matplotlib version in it), so the same bundle makes
the same bytes and a stale figure is found like a stale table.

``scripts/regenerate_docs_tables.py`` rewrites them (``regenerate_docs``), a lane does so for its bundle with
every commit, and ``tests/test_results_docs.py`` fails when a page disagrees with its bundle.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.colors import to_hex

from mtl_cog.analysis.bundle_progress import protocol_progress
from mtl_cog.analysis.protocol_answers import protocol_claims, protocol_power, protocol_secondary
from mtl_cog.analysis.protocol_asymmetry import protocol_asymmetry
from mtl_cog.analysis.protocol_controls import protocol_controls
from mtl_cog.bundles.bundle import read_bundle
from mtl_cog.errors import UserError
from mtl_cog.io import atomic_write_text
from mtl_cog.reporting.bundle_report import TABLE_NAMES, bundle_tables, markdown_of
from mtl_cog.reporting.curve_figures import curve_charts
from mtl_cog.reporting.docs_markers import Block, read_blocks, read_page
from mtl_cog.reporting.marker_filter import apply_where
from mtl_cog.reporting.plots import method_colors
from mtl_cog.reporting.svg_charts import line_chart_svg

# A block may name a table its bundle does not have *yet* (one of TABLE_NAMES whose runs have not finished: the
# summary before any final run, a curve before its lane ran): it reads PENDING until they exist, so a page can be
# laid out before its campaign ends and the lanes fill it in. A name no bundle can have is an error.
PENDING = "*Not in the bundle yet: the runs this table is made of have not finished.*"
NO_MATCH = "*No row of the table matches `where {query}`.*"  # a filter that leaves nothing: no pending runs
PROTOCOL_TABLES = {"claims": protocol_claims, "power": protocol_power, "secondary": protocol_secondary,
                   "asymmetry": protocol_asymmetry, "progress": protocol_progress, "controls": protocol_controls}
FIGURE_TABLES = ("curve",)  # the tables a figure can be drawn of
PENDING_FIGURE = "*Not in the bundle yet: the runs this figure is drawn from have not finished.*"


def _docs_pages(root: Path) -> list[Path]:
    return [p for p in sorted([*(root / "docs").rglob("*.md"), root / "README.md"]) if p.is_file()]


class Marker:
    """One block of a page as the generator reads it: its head's fields (``Block.fields``) by name, ``body``."""

    def __init__(self, block: Block, page: Path) -> None:
        self.block, self.kind, self.fields = block, block.kind, block.fields(page)

    def __getitem__(self, key: str) -> str | None:
        return self.block.body if key == "body" else self.fields.get(key)


def _blocks(text: str, page: Path) -> list[Marker]:
    """The blocks of a page (``docs_markers.read_blocks``: the audit's reading too); a line that looks like a marker
    and opens or closes no block, or a head outside its kind's grammar, is refused with one line naming it."""
    return [Marker(block, page) for block in read_blocks(text, page)]


def bundle_path(root: Path, page: Path, bundle: str) -> Path:
    """The folder a marker names, which must lie under the repository's ``results/`` (where it leads, too)."""
    results = (root / "results").resolve()
    path = (root / bundle).resolve()
    if Path(bundle).is_absolute() or not path.is_relative_to(results) or path == results:
        raise UserError(f"{page}: a marker names {bundle!r}; a bundle of the docs lies under the repository's "
                        "results/ (results/<campaign>/bundle).")
    return path


PROTOCOL_NAMES = ("paper", "fair", "pinned")  # the campaigns a bundle-protocols block sets side by side


def protocol_bundles(match: Marker) -> dict[str, list[str]]:
    """A bundle-protocols block's bundles per protocol, as the marker names them; a protocol other than
    ``PROTOCOL_NAMES``, one named twice, or a bundle under two protocols is refused (one would silently win)."""
    named: dict[str, list[str]] = {}
    for item in match["named"].split():
        protocol, bundles = item.split("=", 1)
        if protocol not in PROTOCOL_NAMES or protocol in named:
            raise UserError(f"bundle-protocols {match['named']}: name each of {', '.join(PROTOCOL_NAMES)} once "
                            f"({protocol!r} is {'named twice' if protocol in named else 'no protocol'}).")
        named[protocol] = bundles.split(",")
    every = [b for bundles in named.values() for b in bundles]
    if len(set(every)) != len(every):
        raise UserError(f"bundle-protocols {match['named']}: a bundle is named twice; each protocol has its own.")
    return named


def bundles_of(match: Marker) -> list[str]:
    """The bundles a block is made of (as its marker names them)."""
    if match.kind == "bundle-protocols":
        return [b for names in protocol_bundles(match).values() for b in names]
    return [match["bundle"]]


def bundles_on(pages: list[Path]) -> set[str]:
    """Every bundle the blocks of ``pages`` are made of (as markers name them)."""
    return {b for page in pages for m in _blocks(read_page(page), page) for b in bundles_of(m)}


def pages_naming(root: Path, bundle: str) -> list[Path]:
    """The docs pages (and README) with a block made of ``bundle`` (as markers name it)."""
    return [p for p in _docs_pages(root) if any(bundle in bundles_of(m) for m in _blocks(read_page(p), p))]


def figures_on(root: Path, pages: list[Path]) -> list[Path]:
    """The SVG files the figure blocks of ``pages`` draw, whichever bundle they are of."""
    return [figure_path(root, page, m["file"]) for page in pages for m in _blocks(read_page(page), page)
            if m.kind == "bundle-figure"]


def figure_path(root: Path, page: Path, name: str) -> Path:
    """A figure's file, relative to its page; it must stay under docs/ and be an .svg (the check reads it back),
    where it leads as well as by its name (a symbolic link to a page would have the page overwritten)."""
    path = (page.parent / name).resolve()
    if (Path(name).is_absolute() or not name.endswith(".svg") or path.suffix != ".svg"
            or not path.is_relative_to((root / "docs").resolve())):
        raise UserError(f"{page}: bundle-figure file {name!r} must be an .svg under docs/, relative to the page.")
    return path


def figure_svg(frame: pd.DataFrame, page: Path, table: str) -> str | None:
    """The SVG of one metric of one data set: the curve of each COG arm, bands for the references; None while
    no COG arm has a finished ratio (references alone draw no curve)."""
    for column in ("data", "metric"):
        if column in frame and frame[column].nunique() > 1:
            raise UserError(f"{page}: a bundle-figure of {table} shows one data set and one metric; it selects "
                            f"{frame[column].nunique()} values of {column} (narrow it: where {column} == '...').")
    colors = {arm: to_hex(c) for arm, c in method_colors(list(frame["arm"])).items()}
    chart = curve_charts(frame, colors)[0]
    seeds = sorted(set(frame["n_seeds"]))
    spread = ("one seed, no interval" if seeds == [1] else
              f"mean over {'/'.join(map(str, seeds))} seeds, 95 % interval")
    chart.title = (f"{frame['data'].iloc[0]}: " if "data" in frame else "") + \
        f"{chart.title}, {spread} (dashed: references)"
    svg = line_chart_svg(chart, width=560, height=300, standalone=True)
    return svg + "\n" if chart.series and svg else None  # no finite point (every mean NaN): nothing to draw


def not_written(path: Path) -> bool:
    """A bundle whose campaign folder (``results/<campaign>/``) does not exist yet: its lane has not committed a run.
    A page may be laid out before then; its block names the bundle instead of a table. (A campaign folder without a
    readable bundle is an error, not this.)"""
    return not path.parent.exists()


def not_written_line(bundle: str) -> str:
    return f"*Not written yet: {bundle} (its lane has not committed a run).*\n"


def protocols_body(root: Path, page: Path, match: Marker, cache: dict) -> str:
    """A bundle-protocols block's table of the bundles that exist, and a line naming those not written yet."""
    if match["table"] not in PROTOCOL_TABLES:
        raise UserError(f"{page}: bundle-protocols names no table {match['table']!r} "
                        f"(those it can name: {', '.join(PROTOCOL_TABLES)}).")
    found, missing = {}, []
    for protocol, names in protocol_bundles(match).items():
        for name in names:
            path = bundle_path(root, page, name)
            if not_written(path):
                missing.append(f"{protocol} ({name})")
                continue
            if ("bundle", path) not in cache:
                cache[("bundle", path)] = read_bundle(path)
            if cache[("bundle", path)] is None:  # its campaign folder is there: damage, as for a table block
                raise UserError(f"{page}: bundle-protocols names {name}, which holds no results bundle.")
            found.setdefault(protocol, []).append(cache[("bundle", path)])
    frame = PROTOCOL_TABLES[match["table"]]({p: found.get(p, []) for p in protocol_bundles(match)}) \
        if found else pd.DataFrame()
    if match["query"] and not frame.empty:
        frame = apply_where(frame, match["query"], f"{page}: bundle-protocols {match['table']}")
    body = PENDING + "\n" if frame.empty else markdown_of(frame).rstrip("\n") + "\n"
    return body + ("" if not missing else f"\n*Not written yet: {', '.join(missing)}.*\n")


def regenerate_docs(root: Path, check: bool = False, only: str | None = None,
                    pages_of: str | None = None) -> list[str]:
    """Rewrite every bundle-table block under ``root/docs`` (and the README) from its bundle, and every
    bundle-figure with its SVG file; with ``check``, write nothing; with ``only`` (a bundle as the markers name
    it), the blocks of that bundle alone; with ``pages_of``, every block of the pages naming that bundle (a lane:
    a block of another bundle on its page that an earlier commit left stale is made right in the same commit).
    -> the blocks that disagreed with their bundle (``file: table``)."""
    stale, cache = [], {}
    # Every page and figure is computed before any is written: a bad block anywhere leaves every file as it was.
    pages: dict[Path, str] = {}
    figures: dict[Path, tuple[str, str | None]] = {}  # file -> (the block that draws it, its SVG or None: removed)

    def frame_of(match: Marker, page: Path, names: tuple[str, ...]) -> pd.DataFrame:
        path, block = bundle_path(root, page, match["bundle"]), "bundle-table" if names == TABLE_NAMES else \
            "bundle-figure"
        if match["table"] not in names:
            raise UserError(f"{page}: {block} names no table {match['table']!r} "
                            f"(those it can name: {', '.join(names)}).")
        if not_written(path):
            return None
        if path not in cache:
            bundle = read_bundle(path)
            if bundle is None:
                raise UserError(f"{page}: {block} names {match['bundle']}, which holds no results bundle.")
            cache[path] = bundle_tables(bundle)
        frame = cache[path].get(match["table"], pd.DataFrame())
        if not match["query"]:
            return frame
        kept = apply_where(frame, match["query"], f"{page}: {block} of {match['bundle']}")
        if kept.empty and not frame.empty:
            kept.attrs["no_match"] = True  # the table is there; nothing in it matches
        return kept

    named = bundles_on(_docs_pages(root))
    for flag, bundle in (("--only", only), ("--pages-of", pages_of)):
        if bundle is not None and bundle not in named:
            raise UserError(f"{flag} {bundle}: no docs block names it (the bundles the pages "
                            f"name: {', '.join(sorted(named)) or 'none'}).")

    for page in _docs_pages(root) if pages_of is None else pages_naming(root, pages_of):
        text = read_page(page)

        def table_for(match: Marker, page: Path = page) -> str:
            if only is not None and match["bundle"] != only:
                return match["body"]
            frame = frame_of(match, page, TABLE_NAMES)
            body = not_written_line(match["bundle"]) if frame is None else markdown_of(frame) + "\n" \
                if not frame.empty else (NO_MATCH.format(query=match["query"]) if frame.attrs.get("no_match")
                                         else PENDING) + "\n"
            if body != match["body"]:
                stale.append(f"{page.relative_to(root)}: {match['table']} of {match['bundle']}")
            return body

        def figure_for(match: Marker, page: Path = page) -> str:
            if only is not None and match["bundle"] != only:
                return match["body"]
            path, frame = figure_path(root, page, match["file"]), frame_of(match, page, FIGURE_TABLES)
            svg = None if frame is None or frame.empty else figure_svg(frame, page, match["table"])
            body = not_written_line(match["bundle"]) if frame is None else PENDING_FIGURE + "\n" if svg is None else (
                f"![{match['table']} of {match['bundle']}"
                + (f" where {match['query']}" if match["query"] else "") + f"]({match['file']})\n")
            if path in figures and figures[path][0] != match.block.head:
                raise UserError(f"{page}: bundle-figure file {match['file']!r} is drawn by two blocks; give each "
                                "its own file.")
            figures[path] = (match.block.head, svg)
            on_disk = path.read_text() if path.is_file() else None
            if body != match["body"] or on_disk != svg:
                stale.append(f"{page.relative_to(root)}: figure {match['file']} of {match['bundle']}")
            return body

        def protocols_for(match: Marker, page: Path = page) -> str:
            if only is not None and only not in bundles_of(match):
                return match["body"]
            body = protocols_body(root, page, match, cache)
            if body != match["body"]:
                stale.append(f"{page.relative_to(root)}: {match['table']} of the protocols {match['named']}")
            return body

        bodies = {"bundle-table": table_for, "bundle-figure": figure_for, "bundle-protocols": protocols_for}
        parts, at = [], 0
        for match in _blocks(text, page):  # each block's body replaced, every other byte of the page kept
            parts += [text[at:match.block.body_start], bodies[match.kind](match)]
            at = match.block.body_end
        new = "".join(parts) + text[at:]
        if new != text:
            pages[page] = new
    if not check:
        for path, (_, svg) in figures.items():
            if svg is None:
                path.unlink(missing_ok=True)  # a figure of runs no longer in the bundle must not survive
            elif not path.is_file() or path.read_text() != svg:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, svg)
        for page, new in pages.items():
            atomic_write_text(page, new)
    return stale
