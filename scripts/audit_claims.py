#!/usr/bin/env python
"""audit_claims: check that a claims page's numbers and readings follow from its committed results bundles.

    python scripts/audit_claims.py docs/results/overconfident.md [--root DIR]
    python scripts/audit_claims.py docs/results/*.md           # every page (each with its appendix, once)

Why a second implementation: ``regenerate_docs_tables.py --check`` proves only that the page equals what mtl_cog
computes from the bundles, so a bug in mtl_cog's reporting would pass it. This script imports nothing of mtl_cog's
reporting but ``mtl_cog.reporting.docs_markers``, the reading of where a block starts and ends, which the two must
share (standard library, numpy, pandas, scipy otherwise): it re-derives the numbers and readings from the bundles'
raw files (runs.csv, results.csv.gz, campaign.json, reliability.csv.gz) with its own reading of the plan's decision
rule.
Audited, on the page and its ``<stem>_appendix.md`` if any: the ``bundle-protocols`` blocks ``claims``, ``power``,
``secondary`` and ``asymmetry``, and the ``bundle-table: <bundle>`` blocks ``claims``, ``regime_gate``, ``curve`` and
``curve_paired``, with the bundle paths their markers name, relative to ``--root`` (default: the page's git root,
else the current directory). Every cell, every expected row once, every column: a dropped, repeated or extra row
or column is a mismatch. The generator's other blocks (progress, scope, chosen settings...) are named on a second
line, ``not audited: ...``, so that "all match" says what it covers; a block kind neither list knows is a mismatch.

The rule as read here: a final run's task-mean metric (recomputed from the task rows) on its ``test`` split, the
selected checkpoint (``baseline+ts``: the baseline run's ``test+ts`` split). Per tuning draw, the paired per-seed
difference variant − counterpart gets a 95 % t interval: *supported* when it excludes 0 on the claimed side,
*contradicted* on the other, *inconclusive at this scale* otherwise. The answer is *incomplete* while a draw lacks
planned seeds; else *not tested at this budget* for COG-TS where, in some draw, its learned temperature stayed
within 1 % of identity on every task of every final run (the variant did nothing to test); else the draws' common
reading or *depends on the tuning draw*. A printed number matches within half a unit of its last printed digit,
never looser than 4 decimals (the generator's). The implementation is the ``claims_audit`` package beside this
script (``rule``, ``bundle``, ``page``, ``checks``, ``curve``).
The numbers of a page's "In short" are checked against its generated tables and its appendix's (``prose``).
Exit status: 0 when all match; 1 on a mismatch (each listed with both values); 2 on bad input (one ``error:`` line).
"""

import argparse
import subprocess
import sys
from pathlib import Path

# the one module shared with the generator, where a docs block starts and ends, is read from this checkout
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from claims_audit.bundle import AuditError  # noqa: E402
from claims_audit.checks import audit_page  # noqa: E402
from claims_audit.page import Audit  # noqa: E402
from claims_audit.prose import audit_prose  # noqa: E402

from mtl_cog.reporting.docs_markers import MarkerError, read_page  # noqa: E402


def repository_root(page: Path) -> Path:
    """The page's git root, else the current directory."""
    try:
        return Path(subprocess.run(["git", "-C", str(page.parent), "rev-parse", "--show-toplevel"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return Path.cwd()


def families(pages: list[Path]) -> list[list[Path]]:
    """Each page with its ``<stem>_appendix.md`` (an appendix given alone: with its page), each page once: prose of
    either is checked against the tables of both."""
    out, seen = [], set()
    for page in pages:
        main = page.with_name(page.name.removesuffix("_appendix.md") + ".md") if page.name.endswith(
            "_appendix.md") else page
        family = [p for p in (main, main.with_name(f"{main.stem}_appendix.md")) if p == page or p.is_file()]
        family = [p for p in family if p.resolve() not in seen]
        seen.update(p.resolve() for p in family)
        out += [family] if family else []
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", type=Path, nargs="+", metavar="page",
                        help="claims pages, e.g. docs/results/overconfident.md (each with its _appendix.md)")
    parser.add_argument("--root", type=Path, help="the directory the markers' bundle paths are relative to "
                        "(default: the page's git root, else the current directory)")
    args = parser.parse_args(argv)
    named = " ".join(map(str, args.pages))
    try:
        for page in args.pages:
            if not page.is_file():
                raise AuditError(f"{'not a file' if page.exists() else 'page not found'}: {page}")
        audit, audited = Audit(args.root or repository_root(args.pages[0].resolve())), 0
        for family in families(args.pages):
            audit.cells = []  # a family's prose is checked against its own tables
            audited += sum(audit_page(audit, page) for page in family)
            audited += sum(audit_prose(audit, page, read_page(page), audit.cells) for page in family)
        if not audited:
            raise AuditError(f"{named} has no bundle-protocols or bundle-table markers this script audits")
    except (AuditError, MarkerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = f"{len(audit.mismatches)} mismatch(es):\n  " + "\n  ".join(audit.mismatches)
    print(f"audited {audit.numbers} numbers and {audit.readings} readings in {named}: "
          f"{found if audit.mismatches else 'all match'}")
    if audit.skipped:  # generated blocks nothing here checks: named, so a reader knows what 'all match' covers
        kinds = sorted(set(audit.skipped))
        print(f"not audited: {len(audit.skipped)} blocks ("
              + ", ".join(f"{k} ×{audit.skipped.count(k)}" for k in kinds) + ")")
    return 1 if audit.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
