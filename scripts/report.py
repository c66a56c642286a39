#!/usr/bin/env python
"""report: every table of a campaign from its results bundle (the command is mtl_cog/cli/report.py)."""

from mtl_cog.cli.report import cli

if __name__ == "__main__":
    cli()
