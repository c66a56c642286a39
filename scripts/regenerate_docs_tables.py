#!/usr/bin/env python
"""Regenerate every results table in docs/ from the committed results bundles it names.

    python scripts/regenerate_docs_tables.py            # rewrite the tables
    python scripts/regenerate_docs_tables.py --check    # list tables that disagree with their bundle; exit 2 if any

A results table sits between ``<!-- bundle-table: results/<campaign>/bundle <table> [where <query>] -->``
and ``<!-- /bundle-table -->`` (mtl_cog/reporting/bundle_report.py); tests/test_results_docs.py runs --check.
"""

import argparse
import sys
from pathlib import Path

from mtl_cog.errors import run_cli
from mtl_cog.reporting.bundle_report import regenerate_docs

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 2 when a table disagrees")
    args = parser.parse_args(argv)
    stale = regenerate_docs(ROOT, check=args.check)
    for line in stale:
        print(("stale: " if args.check else "rewritten: ") + line)
    return 2 if args.check and stale else 0


if __name__ == "__main__":
    run_cli(lambda: sys.exit(main()))
