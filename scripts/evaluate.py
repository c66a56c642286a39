#!/usr/bin/env python
"""evaluate: score prediction files or a run, fit post-hoc calibrators (the command is mtl_cog/cli/evaluate.py)."""

from mtl_cog.cli.evaluate import cli

if __name__ == "__main__":
    cli()
