#!/usr/bin/env python
"""benchmark: speed and memory, measured side by side (the command is mtl_cog/cli/benchmark.py)."""

from mtl_cog.cli.benchmark import cli

if __name__ == "__main__":
    cli()
