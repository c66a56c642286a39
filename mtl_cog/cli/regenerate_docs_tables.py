"""regenerate-docs-tables: every results table in docs/ rewritten from the committed results bundles it names.

    python scripts/regenerate_docs_tables.py            # rewrite the tables
    python scripts/regenerate_docs_tables.py --check    # list tables that disagree with their bundle; exit 2 if any
    python scripts/regenerate_docs_tables.py --only results/fashion_mnist_full/bundle   # that bundle's blocks
    python scripts/regenerate_docs_tables.py --pages-of results/fashion_mnist_full/bundle   # its pages, whole

A results table sits between ``<!-- bundle-table: results/<campaign>/bundle <table> [where <query>] -->``
and ``<!-- /bundle-table -->`` (``mtl_cog/reporting/bundle_report.py``), a leader-rate figure (an SVG file
next to the page) between ``<!-- bundle-figure: results/<campaign>/bundle curve figures/<name>.svg [where
<query>] -->`` and ``<!-- /bundle-figure -->`` (``mtl_cog/reporting/docs_tables.py``);
``tests/test_results_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import UserError, run_cli
from mtl_cog.reporting.docs_tables import regenerate_docs


def main(argv: list[str] | None = None) -> list[str]:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 2 when a table disagrees")
    parser.add_argument("--only", default=None, help="the blocks of this bundle alone (as the markers name it, "
                        "e.g. results/fashion_mnist_full/bundle)")
    parser.add_argument("--pages-of", default=None, help="every block of the pages naming this bundle (what a "
                        "lane commits with it)")
    parser.add_argument("--root", default=str(CONFIGS.parent), help=argparse.SUPPRESS)  # the lane: its checkout
    args = parser.parse_args(argv)
    if args.only is not None and args.pages_of is not None:
        raise UserError("--only and --pages-of: give one of them.")
    stale = regenerate_docs(Path(args.root), check=args.check, only=args.only, pages_of=args.pages_of)
    for line in stale:
        print(("stale: " if args.check else "rewritten: ") + line)
    if args.check and stale:
        raise UserError(f"{len(stale)} results table(s) in docs/ disagree with their bundle; run "
                        "python scripts/regenerate_docs_tables.py")
    return stale


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
