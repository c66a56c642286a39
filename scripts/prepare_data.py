#!/usr/bin/env python
"""prepare_data: decode a data set once into its cache (the command is mtl_cog/cli/prepare_data.py)."""

from mtl_cog.cli.prepare_data import cli

if __name__ == "__main__":
    cli()
