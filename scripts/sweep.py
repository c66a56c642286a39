#!/usr/bin/env python
"""sweep: a grid of overrides, chosen on validation NLL (the command is mtl_cog/cli/sweep.py)."""

from mtl_cog.cli.sweep import cli

if __name__ == "__main__":
    cli()
