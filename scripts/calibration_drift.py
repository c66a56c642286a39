#!/usr/bin/env python
"""calibration_drift: how calibration drifts during training (the command is mtl_cog/cli/calibration_drift.py)."""

from mtl_cog.cli.calibration_drift import cli

if __name__ == "__main__":
    cli()
