#!/usr/bin/env python
"""generate_reference: write docs/reference/ from the code (the command is mtl_cog/cli/generate_reference.py)."""

from mtl_cog.cli.generate_reference import cli

if __name__ == "__main__":
    cli()
