"""Where a generated block of a docs page starts and ends: the one reading the generator and the claims audit share.

A block is an opener line, its body, and the closer of its kind, each marker a whole line of its own::

    <!-- bundle-table: results/<campaign>/bundle <table> [where <filter>] -->
    ... body ...
    <!-- /bundle-table -->

(kinds ``bundle-table``, ``bundle-figure``, ``bundle-protocols``). The grammar is strict about near-misses, because a
line that renders as the same hidden comment but is not read as a marker would hide a hand-typed table from every
check: any line that *looks like* a marker (it starts, after any spaces, tabs or byte-order mark, with ``<!--`` and
then, in any case and spacing, ``bundle`` or ``/bundle``) must be exactly an opener or the closer of the open block,
or the page is refused in one line naming page and line. A marker quoted in prose (inside a sentence or a code span)
does not start its line and is prose.

An opener's head ends at the first `` -->`` outside a quoted literal (``'...'`` or ``"..."``, as ``marker_filter``
reads them), which must end the line: a ``>`` or ``-->`` inside a ``where`` clause's string is part of the head, and
an unclosed quote is refused. One pass over the lines: linear in the page, however many markers are left open.

This module imports nothing of the project but its errors, so ``scripts/claims_audit`` (which otherwise never
imports mtl_cog) reads blocks exactly as the generator does, and keeps its own arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mtl_cog.errors import UserError

KINDS = ("bundle-table", "bundle-figure", "bundle-protocols")
# what a reader might take for a marker: after any indentation or BOM, "<!--", any spacing, an optional "/", "bundle"
LOOKS_LIKE = re.compile(r"^[\s\ufeff\u200b]*<!--\s*/?\s*bundle", re.IGNORECASE)
OPENER = re.compile(r"<!-- (?P<kind>bundle-(?:table|figure|protocols)): ")
# the fields of each kind's head (the generator's reading; the audit reads the head text on its own)
HEADS = {
    "bundle-table": re.compile(r"(?P<bundle>\S+) (?P<table>\w+)(?: where (?P<query>.+))?"),
    "bundle-figure": re.compile(r"(?P<bundle>\S+) (?P<table>\w+) (?P<file>\S+)(?: where (?P<query>.+))?"),
    "bundle-protocols": re.compile(r"(?P<table>\w+) (?P<named>\w+=\S+(?: \w+=\S+)*)(?: where (?P<query>.+))?"),
}
NO_BLOCK = "no complete bundle-table, bundle-figure or bundle-protocols block"


class MarkerError(UserError):
    """A page whose markers cannot be read as blocks; the message names page and line."""


@dataclass(frozen=True)
class Block:
    kind: str  # one of KINDS
    head: str  # the opener between "<!-- <kind>: " and " -->"
    line: int  # the opener's line, from 1
    start: int  # offsets in the page's text: the opener's first character,
    body_start: int  # the body's first (the line after the opener),
    body_end: int  # the closer's first,
    end: int  # and the first after the closer line (its newline included)
    text: str  # the page's text, for ``body``

    @property
    def body(self) -> str:
        return self.text[self.body_start:self.body_end]

    @property
    def opener(self) -> str:
        return self.text[self.start:self.body_start]

    @property
    def closer(self) -> str:
        return self.text[self.body_end:self.end]

    def fields(self, page: Path | str) -> dict[str, str | None]:
        """The head's fields (``bundle``, ``table``, ``file``, ``named``, ``query``: those of its kind); a head outside
        its kind's grammar is refused naming page and line."""
        match = HEADS[self.kind].fullmatch(self.head)
        if match is None:
            raise MarkerError(f"{page}:{self.line}: {self.opener.strip()[:80]!r} is {NO_BLOCK} (a malformed head: "
                              f"{_HEAD_HELP[self.kind]}).")
        return match.groupdict()


_HEAD_HELP = {"bundle-table": "<!-- bundle-table: results/<campaign>/bundle <table> [where <filter>] -->",
              "bundle-figure": "<!-- bundle-figure: results/<campaign>/bundle curve figures/<name>.svg [where ...] -->",
              "bundle-protocols": "<!-- bundle-protocols: <table> paper=<bundles> fair=<bundles> [where ...] -->"}


def read_page(page: Path) -> str:
    """A docs page's text; one error line when it cannot be read or is not UTF-8."""
    try:
        return Path(page).read_bytes().decode("utf-8")
    except OSError as err:
        raise MarkerError(f"cannot read {page}: {err.strerror or err}.") from None
    except UnicodeDecodeError as err:
        raise MarkerError(f"cannot read {page}: not UTF-8 text (byte {err.start}: {err.reason}); save the page as "
                          "UTF-8.") from None


def _head(line: str) -> tuple[str, str] | None:
    """(kind, head) of a canonical opener line (its newline stripped), else None. The head ends at the first " -->"
    outside a quoted literal, which must end the line."""
    match = OPENER.match(line)
    if match is None:
        return None
    quote = None
    at = match.end()
    for i in range(at, len(line)):
        char = line[i]
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith(" -->", i):
            head = line[at:i]
            if i + 4 != len(line) or not head or head != head.strip():
                return None
            return match["kind"], head
    return None


def _refused(page, number: int, line: str, why: str) -> MarkerError:
    return MarkerError(f"{page}:{number}: {line.strip()[:80]!r} is {NO_BLOCK} ({why}); a marker is a whole line, "
                       "'<!-- bundle-<kind>: <head> -->' or '<!-- /bundle-<kind> -->', lowercase, one space after "
                       "'<!--', nothing before or after it (quote one in prose inside a code span).")


def read_blocks(text: str, page: Path | str) -> list[Block]:
    """Every block of a page's ``text``, in order; a line that looks like a marker and is none (a near miss, a closer
    without its opener, an opener inside a block, a block never closed) is refused naming ``page`` and its line."""
    blocks: list[Block] = []
    open_at: tuple[str, str, int, int, int] | None = None  # kind, head, line, start, body start
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        begin, offset = offset, offset + len(line)
        if not LOOKS_LIKE.match(line):
            continue
        bare = line[:-1] if line.endswith("\n") else line
        if open_at is None:
            head = _head(bare)
            if head is None:
                why = ("a closer without its opener" if re.match(r"<!-- /bundle-", bare) else
                       "not a marker as written: check its indentation, spacing, case and kind")
                raise _refused(page, number, line, why)
            open_at = (*head, number, begin, offset)
            continue
        kind, head, first, start, body_start = open_at
        if bare == f"<!-- /{kind} -->":
            blocks.append(Block(kind, head, first, start, body_start, begin, offset, text))
            open_at = None
        elif _head(bare) is not None:
            raise _refused(page, first, text[start:body_start], f"never closed: line {number} opens another block "
                                                                f"before its <!-- /{kind} -->")
        else:
            raise _refused(page, number, line, f"inside the {kind} block of line {first}, where only its "
                                               f"<!-- /{kind} --> may stand")
    if open_at is not None:
        kind, _, first, start, body_start = open_at
        raise _refused(page, first, text[start:body_start], f"never closed: no <!-- /{kind} --> follows")
    return blocks
