"""A claims page's generated blocks (marker, header, rows) and the ledger of comparisons: a printed number against
ours, a printed word against ours, every expected row and column present once."""

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from claims_audit.bundle import AuditError, Bundle
from mtl_cog.reporting.docs_markers import MarkerError, read_blocks, read_page

# a marker's 'where' clause, read as data as the generator reads it: 'column == literal', 'column != literal' or
# 'column in [literal, ...]' joined by 'and'; a literal is a quoted string or a number
LITERAL = r"'[^'\n]*'|\"[^\"\n]*\"|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
CONDITION = re.compile(rf"\s*([A-Za-z_][A-Za-z0-9_@.+-]*)\s*(?:(==|!=)\s*({LITERAL})|in\s*\[((?:\s*(?:{LITERAL})\s*,)*"
                       rf"\s*(?:{LITERAL}))\s*\])\s*(?:and\b|$)")
DECIMALS = 4  # the generator prints every audited number to 4 decimals: a coarser one hides a change
# a per-draw claims cell: 'reading (difference [low, high])', wrapped in 'not tested at this budget (...)' where
# COG-TS's temperature stayed at identity, then '(draw d: n of p seeds)' while the draw is short of seeds
CELL = re.compile(r"^(?:(does not test COG \(schedule\)) \()?(?:(not tested at this budget) \()?"
                  r"(supported|contradicted|inconclusive at this scale|no interval \(one seed\)) "
                  r"\(([+-][0-9.]+)(?: \[([+-][0-9.]+), ([+-][0-9.]+)\])?\)\)?\)?"
                  r"(?: \(draw \d+: (\d+) of (\d+) seeds\))?$")
# the whole of one draw's segment: what follows the seeds is ', incomplete' or a '; ...' note (not audited), then ')'
SECONDARY_SEGMENT = re.compile(r"^(\d+: (?:variant|counterpart|inconclusive|no interval \(one seed\)) \((?:\d+ of )?"
                               r"\d+ seeds(?:, incomplete)?)(?:; .*)?\)$|^(\d+: not run yet)$")


class Audit:
    """The comparisons made and the mismatches found."""

    def __init__(self, root: Path):
        self.root, self.bundles, self.mismatches = root, {}, []
        self.numbers = self.readings = 0
        self.skipped: list[str] = []  # generated blocks no check here reads: reported, never passed silently
        self.cells: list[str] = []  # every cell of the generated tables read, which prose numbers are checked against

    def bundle(self, rel: str) -> Bundle | None:
        """The bundle at ``rel``; None where its campaign folder does not exist yet (its lane has not committed a
        run: the generator writes a 'Not written yet' line there, no table)."""
        if not (self.root / rel).parent.exists():
            return None
        if rel not in self.bundles:
            try:
                self.bundles[rel] = Bundle(self.root / rel)
            except (KeyError, TypeError, ValueError) as err:
                raise AuditError(f"{self.root / rel}: a bundle file lacks or misstates {err}") from None
        return self.bundles[rel]

    def number(self, what: str, cell: str, ours: float, slack: float = 0.0) -> None:
        """A printed number matches ours within half a unit of its last printed digit (0.0043: ± 0.00005, float
        slack aside), or within ``slack`` where the page's number is an estimate (a simulation); a blank cell
        stands for no value."""
        self.numbers += 1
        cell = str(cell).strip()
        try:  # never looser than the generator's 4 decimals: '0' or '0E+5' must not pass for -0.0043
            exponent = Decimal(cell).as_tuple().exponent if cell else 0
            tolerance = max(0.5 * 10.0 ** min(exponent, -DECIMALS) + 1e-12, slack)
            ok = abs(float(cell) - ours) <= tolerance if cell else not np.isfinite(ours)
        except (InvalidOperation, TypeError, ValueError):  # not a number where the page should print one
            ok = False
        if not ok:
            self.mismatches.append(f"{what}: page {cell or '(blank)'}, bundles {ours:.6g}")

    def text(self, what: str, cell: str, ours: str) -> None:
        self.readings += 1
        if str(cell).strip() != ours:
            self.mismatches.append(f"{what}: page {cell or '(blank)'!r}, bundles {ours or '(blank)'!r}")

    def columns(self, where: str, header: list[str], known: set[str], required: set[str]) -> None:
        """A column no check reads, or one a check needs, is a mismatch, not a silent pass (no table at all: the
        generator's 'not in the bundle yet' line, which ``coverage`` accepts only where no row is due)."""
        if not header:
            return
        for column in sorted(set(header) - known):
            self.text(f"{where}: column {column!r}", "present", "absent (no check reads it)")
        for column in sorted(required - set(header)):
            self.text(f"{where}: column {column!r}", "absent", "present")

    def coverage(self, where: str, keys: list[tuple], expected: set[tuple]) -> None:
        """Every expected row once: a dropped, duplicated or stray row is a mismatch."""
        seen = set()
        for key in keys:
            if key in seen:
                self.text(f"{where}: row {key}", "repeated", "once")
            seen.add(key)
        for key in sorted(expected - seen, key=str):
            self.text(f"{where}: row {key}", "(missing)", "present")
        for key in sorted(seen - expected, key=str):
            self.text(f"{where}: row {key}", "present", "(not expected)")


def tables(path: Path) -> list[tuple[str, list[str], list[dict]]]:
    """Each generated block's marker (without ``<!-- -->``), its Markdown table's header and rows. Where a block
    starts and ends is the generator's own reading (``mtl_cog.reporting.docs_markers``, the one thing this audit
    shares with it): a line that looks like a marker and is none is bad input naming page and line, never skipped."""
    try:
        blocks = read_blocks(read_page(path), path)
    except MarkerError as err:
        raise AuditError(str(err)) from None
    found = []
    for block in blocks:
        head = f"{block.kind}: {block.head}"
        if block.kind == "bundle-figure":  # an SVG the generator draws, no table here: named as such
            found.append((head, [], []))
            continue
        lines = [line for line in block.body.splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")] if lines else []
        rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
        found.append((head, header, rows))
    return found


def protocol_bundles(audit: Audit, head: str) -> dict[tuple[str, str], Bundle]:
    """``(protocol, data set) -> bundle`` from a ``bundle-protocols`` marker's ``paper=a,b fair=c,d``."""
    found = {}
    for protocol, paths in re.findall(r"(\w+)=([^\s=]+)", head.split(" where ")[0]):
        for rel in paths.split(","):
            bundle = audit.bundle(rel)
            if bundle is None:  # not written yet: the page names it on a line of its own
                continue
            found.update({(protocol, data): bundle for data in bundle.data})
    return found


def literal(text: str) -> str | float:
    return text[1:-1] if text[:1] in "'\"" else float(text)


def kept(head: str, columns: tuple[str, ...], candidates) -> set[tuple]:
    """The candidate rows (tuples of ``columns``) that the marker's ``where`` clause keeps (all, without one): a
    quoted literal compares with the cell's text, a number with its value. A clause outside the grammar, or on a
    column not in ``columns``, is a ValueError (the block is then reported unrecognised, never passed)."""
    clause, conditions, at = head.partition(" where ")[2], [], 0
    while at < len(clause):
        match = CONDITION.match(clause, at)
        if not match or match.end() == at:
            raise ValueError(f"a where clause this audit cannot read: {clause[at:]!r}")
        column, operator, one, many = match.groups()
        if column not in columns:
            raise ValueError(f"a where clause on {column!r}, a column this audit does not filter on")
        values = [literal(one)] if one else [literal(v) for v in re.findall(LITERAL, many)]
        conditions.append((columns.index(column), operator != "!=", values))
        at = match.end()

    def equal(cell, value) -> bool:
        try:
            return float(cell) == value if isinstance(value, float) else str(cell) == value
        except (TypeError, ValueError):
            return False
    return {c for c in candidates
            if all(any(equal(c[i], v) for v in values) == wanted for i, wanted, values in conditions)}


def keys(rows: list[dict], columns: tuple[str, ...]) -> list[tuple]:
    """Each page row's key: its cells in ``columns``."""
    return [tuple(row.get(column) for column in columns) for row in rows]


def split_top(cell: str) -> list[str]:
    """``cell`` split at the ', ' outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(cell):
        depth += (char == "(") - (char == ")")
        if depth == 0 and cell.startswith(", ", i):
            parts.append(cell[start:i])
            start = i + 2
    return parts + [cell[start:]]


