#!/usr/bin/env python
"""leader-curve: one COG method across leader/follower ratios 1e-3..1 (the command is mtl_cog/cli/leader_curve.py)."""

from mtl_cog.cli.leader_curve import cli

if __name__ == "__main__":
    cli()
