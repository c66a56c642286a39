#!/usr/bin/env python
"""list_front: LiST's accuracy-robustness-calibration front (the command is mtl_cog/cli/list_front.py)."""

from mtl_cog.cli.list_front import cli

if __name__ == "__main__":
    cli()
