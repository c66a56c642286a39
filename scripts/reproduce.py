#!/usr/bin/env python
"""reproduce: the paper's comparison at CPU scale (the command is mtl_cog/cli/reproduce.py)."""

from mtl_cog.cli.reproduce import cli

if __name__ == "__main__":
    cli()
