#!/usr/bin/env python
"""lane: a campaign command run from frozen code, its bundle committed as runs finish (mtl_cog/cli/lane.py)."""

from mtl_cog.cli.lane import cli

if __name__ == "__main__":
    cli()
