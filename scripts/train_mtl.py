#!/usr/bin/env python
"""train_mtl: train a run (accelerate launch scripts/train_mtl.py ...) (the command is mtl_cog/cli/train.py)."""

from mtl_cog.cli.train import cli

if __name__ == "__main__":
    cli()
