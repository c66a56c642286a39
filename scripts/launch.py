#!/usr/bin/env python
"""launch: accelerate launch with one error line per failed process (the command is mtl_cog/cli/launch.py)."""

from mtl_cog.cli.launch import cli

if __name__ == "__main__":
    cli()
