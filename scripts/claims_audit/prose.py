"""The numbers a page states in prose, checked against its generated tables.

A page's "In short" section restates numbers from its tables by hand; nothing else would notice one that changed.
Every number written with a decimal point there (``0.441``, ``−8.7 %``, ``8.3e-3``, ``4.6×``; integers are counts,
seeds and sizes, not read) must be, up to its sign and within half a unit of its last printed digit, a number of one
of the generated tables of the page or its appendix (a percentage may be a fraction there: ``−8.7 %`` for
``-0.0870``). The text of generated blocks, code spans, fenced code and link targets is not prose. A number not found
is a mismatch naming page and line, so a hand-typed number either comes from a table or is flagged.
"""

import bisect
import re
from pathlib import Path

from claims_audit.page import Audit
from mtl_cog.reporting.docs_markers import read_blocks

# a number with a decimal point, not part of a word, a version, a key=value or a metric name such as ece@15
PROSE_NUMBER = re.compile(r"(?<![\w.@/=])[+\-\u2212]?(\d+\.\d+|\.\d+)(?:[eE]([+\-\u2212]?\d+))?(?!\w|\.\d)(\s?%)?")
CELL_NUMBER = re.compile(r"[+\-\u2212]?(?:\d+\.?\d*|\.\d+)(?:[eE][+\-\u2212]?\d+)?")
SECTION = re.compile(r"^(#{1,6})\s+In short\s*$", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def table_numbers(cells: list[str]) -> list[float]:
    """Every number in the cells of the generated tables, by magnitude, sorted (a cell may hold several: an
    ``overrides`` cell, a reading with its interval)."""
    found = set()
    for cell in cells:
        for text in CELL_NUMBER.findall(str(cell)):
            try:
                found.add(abs(float(text.replace("\u2212", "-"))))
            except ValueError:
                continue
    return sorted(found)


def _near(numbers: list[float], value: float, tolerance: float) -> bool:
    at = bisect.bisect_left(numbers, value - tolerance)
    return at < len(numbers) and numbers[at] <= value + tolerance


def in_short_lines(text: str, generated: set[int]) -> list[tuple[int, str]]:
    """(line number, prose) of the page's "In short" sections: the lines of generated blocks (``generated``) and
    fenced code left out, code spans and link targets blanked."""
    lines, inside, level, fenced = [], False, 0, False
    for number, line in enumerate(text.splitlines(), start=1):
        heading = HEADING.match(line)
        if SECTION.match(line):
            inside, level = True, len(SECTION.match(line)[1])
            continue
        if heading and len(heading[1]) <= level:
            inside = False
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if inside and not fenced and number not in generated:
            lines.append((number, LINK_TARGET.sub("]", CODE_SPAN.sub("", line))))
    return lines


def generated_lines(text: str, path: Path) -> set[int]:
    """The line numbers of the page's generated blocks, markers included."""
    starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    lines = set()
    for block in read_blocks(text, path):
        last = bisect.bisect_right(starts, max(block.end - 1, block.start))
        lines.update(range(block.line, last + 1))
    return lines


def audit_prose(audit: Audit, path: Path, text: str, cells: list[str]) -> int:
    """Check every number of ``path``'s "In short" against ``cells`` (the page family's generated tables); -> how
    many numbers were read."""
    numbers, read, generated = table_numbers(cells), 0, generated_lines(text, path)
    for number, line in in_short_lines(text, generated):
        for match in PROSE_NUMBER.finditer(line):
            digits, exponent, percent = match.group(1), int((match.group(2) or "0").replace("\u2212", "-")), \
                match.group(3)
            value = abs(float(digits) * 10.0 ** exponent)
            places = len(digits.partition(".")[2]) - exponent
            tolerance = 0.5 * 10.0 ** -places + 1e-12
            read += 1
            audit.numbers += 1
            if not (_near(numbers, value, tolerance)
                    or (percent and _near(numbers, value / 100, tolerance / 100))):
                audit.mismatches.append(f"{path}:{number}: In short number {match.group(0).strip()}: in no generated "
                                        "table of the page or its appendix (within its printed digits)")
    return read
