"""report: every table of a campaign, regenerated from its committed results bundle alone.

    mtl-cog report --bundle results/fashion_mnist_full/bundle --out runs/report
    mtl-cog report --bundle OUT/bundle --markdown summary          # print one table as Markdown
    mtl-cog report --bundle OUT/bundle --list                       # the tables this bundle has
    mtl-cog report --bundle results/NAME/bundle --seal              # seal a bundle written before seals

A bundle (``OUT/bundle`` of a sweep, leader curve or reproduction; ``mtl_cog/bundles/bundle.py``)
holds every run's labels, task-level results at the selected checkpoint and per-epoch curves; no
run folder is read. Written to ``--out``: ``<table>.csv`` and ``<table>.md`` for each table
(``mtl_cog/reporting/bundle_report.py``: summary, paired, verdicts, chosen, convergence, curve,
curve_paired, sweep_settings, sweep_paired), ``report.md`` with all of them and ``report.html`` (the
tables, the Pareto fronts, worst tasks, per-task ECE and, from the bundle's ``reliability.csv.gz``, each
method's reliability diagram per task); the last line printed names the ``report.html`` written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from filelock import FileLock

from mtl_cog.bundles.bundle import read_bundle, seal_bundle
from mtl_cog.bundles.bundle_manifest import MANIFEST
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import UserError, run_cli
from mtl_cog.io import check_writable
from mtl_cog.reporting.bundle_report import bundle_tables, markdown_of, write_bundle_report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="a results bundle folder (OUT/bundle)")
    parser.add_argument("--out", type=Path, default=None, help="write every table here (CSV, Markdown, report.md)")
    parser.add_argument("--markdown", metavar="TABLE", default=None, help="print this table as Markdown")
    parser.add_argument("--list", action="store_true", help="print the names of the tables this bundle has")
    parser.add_argument("--seal", action="store_true", help="write the manifest.json of a bundle written before "
                        "bundles were sealed, after every check (its tables are not rewritten)")
    args = parser.parse_args(argv)
    if args.out is None and args.markdown is None and not args.list and not args.seal:
        raise UserError("report: give --out DIR, --markdown TABLE, --list or --seal (see mtl-cog report --help).")
    return args


def main(argv: list[str] | None = None) -> Path | None:
    args = parse_args(argv)
    if args.seal:  # under the campaign's collection lock (OUT/bundle.lock), as a campaign writes its bundle
        with FileLock(str(args.bundle.parent / "bundle.lock")):
            sealed = seal_bundle(args.bundle)
        print(f"{args.bundle / MANIFEST}: " + ("written" if sealed else "already sealed, and its files match it"))
        if args.out is None and args.markdown is None and not args.list:
            return None
    bundle = read_bundle(args.bundle)
    if bundle is None:
        raise UserError(f"--bundle {args.bundle}: no results bundle there (no campaign.json). A campaign writes it "
                        "as OUT/bundle.")
    if args.out is not None:  # refused before any table is computed
        check_writable(args.out, "--out", folder=True)
    tables = bundle_tables(bundle)
    if args.list:
        print("\n".join(tables))
    if args.markdown is not None:
        if args.markdown not in tables:
            raise UserError(f"--markdown {args.markdown}: this bundle has no such table; it has "
                            f"{', '.join(tables) or 'none (no finished run)'}.")
        print(markdown_of(tables[args.markdown]))
    if args.out is not None:
        path = write_bundle_report(bundle, args.out, tables)
        html = args.out / "report.html"  # written with every finished final or curve run, removed without one
        print(f"wrote {html}" if html.is_file() else f"wrote {path} (no report.html: no finished final or curve run "
              "in the bundle yet)")  # the last line names the page to open
        return path
    return None


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
