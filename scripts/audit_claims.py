#!/usr/bin/env python
"""audit_claims: check that a claims page's numbers and readings follow from its committed results bundles.

    python scripts/audit_claims.py docs/results/overconfident.md [--root DIR]

Why a second implementation: ``regenerate_docs_tables.py --check`` proves only that the page equals what mtl_cog
computes from the bundles, so a bug in mtl_cog's reporting would pass it. This script never imports mtl_cog
(standard library, numpy, pandas, scipy only): it re-derives the numbers and readings from the bundles' raw files
(runs.csv, results.csv.gz, campaign.json, reliability.csv.gz) with its own reading of the plan's decision rule.
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
Exit status: 0 when all match; 1 on a mismatch (each listed with both values); 2 on bad input (one ``error:`` line).
"""

import argparse
import subprocess
import sys
from pathlib import Path

from claims_audit.bundle import AuditError
from claims_audit.checks import audit_page
from claims_audit.page import Audit


def repository_root(page: Path) -> Path:
    """The page's git root, else the current directory."""
    try:
        return Path(subprocess.run(["git", "-C", str(page.parent), "rev-parse", "--show-toplevel"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return Path.cwd()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the claims page, e.g. docs/results/overconfident.md")
    parser.add_argument("--root", type=Path, help="the directory the markers' bundle paths are relative to "
                        "(default: the page's git root, else the current directory)")
    args = parser.parse_args(argv)
    try:
        if not args.page.is_file():
            raise AuditError(f"{'not a file' if args.page.exists() else 'page not found'}: {args.page}")
        audit = Audit(args.root or repository_root(args.page.resolve()))
        pages = [args.page] + [p for p in [args.page.with_name(f"{args.page.stem}_appendix.md")] if p.is_file()]
        if not sum(audit_page(audit, page) for page in pages):
            raise AuditError(f"{args.page} has no bundle-protocols or bundle-table markers this script audits")
    except AuditError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = f"{len(audit.mismatches)} mismatch(es):\n  " + "\n  ".join(audit.mismatches)
    print(f"audited {audit.numbers} numbers and {audit.readings} readings in {args.page}: "
          f"{found if audit.mismatches else 'all match'}")
    if audit.skipped:  # generated blocks nothing here checks: named, so a reader knows what 'all match' covers
        kinds = sorted(set(audit.skipped))
        print(f"not audited: {len(audit.skipped)} blocks ("
              + ", ".join(f"{k} ×{audit.skipped.count(k)}" for k in kinds) + ")")
    return 1 if audit.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
