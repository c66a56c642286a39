#!/usr/bin/env python
"""parameter_counts: parameter counts of every method (the command is mtl_cog/cli/parameter_counts.py)."""

from mtl_cog.cli.parameter_counts import cli

if __name__ == "__main__":
    cli()
