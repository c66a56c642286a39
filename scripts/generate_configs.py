#!/usr/bin/env python
"""generate_configs: write the data set x method config files (the command is mtl_cog/cli/generate_configs.py)."""

from mtl_cog.cli.generate_configs import cli

if __name__ == "__main__":
    cli()
