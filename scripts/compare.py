#!/usr/bin/env python
"""compare: compare methods across run folders (the command is mtl_cog/cli/compare.py)."""

from mtl_cog.cli.compare import cli

if __name__ == "__main__":
    cli()
