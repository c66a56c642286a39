#!/usr/bin/env python
"""Score predictions: any prediction file, or a run's best checkpoint re-evaluated.

    python scripts/evaluate.py --predictions FILE.npz [--bins 5 10 15 20 50] --out metrics.json
    accelerate launch scripts/evaluate.py --run RUN_DIR [--split test] --out metrics.json

The JSON is {"tasks": {task: {metric: value}}, "mean": {metric: value}}; the metric names are
accuracy, nll, brier, ece@B, rmsce@B, mce@B (see mtl_cog/metrics.py for the conventions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tasks  # noqa: E402,F401  (registers the data sets)
from mtl_cog.errors import UserError, run_cli  # noqa: E402
from mtl_cog.evaluation import load_trained_run, predict_split, score  # noqa: E402
from mtl_cog.io import atomic_write_json  # noqa: E402
from mtl_cog.metrics import format_table  # noqa: E402
from mtl_cog.predictions import load_predictions  # noqa: E402

DEFAULT_BINS = [5, 10, 15, 20, 50]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--predictions", type=Path, help="a prediction file (.npz, see mtl_cog/predictions.py)")
    source.add_argument("--run", type=Path, help="a run folder: re-evaluate its best checkpoint")
    parser.add_argument("--split", choices=["train", "val", "test"], default="test", help="with --run")
    parser.add_argument("--bins", type=int, nargs="+", default=None, help=f"bin counts (default {DEFAULT_BINS})")
    parser.add_argument("--out", type=Path, required=True, help="where to write the metrics JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.bins is not None and any(b <= 0 for b in args.bins):
        raise UserError(f"--bins must be positive integers. Got {args.bins}.")
    if args.predictions is not None:
        metrics = score(load_predictions(args.predictions), args.bins or DEFAULT_BINS)
        print(format_table(metrics))
        atomic_write_json(args.out, metrics)
        print(args.out)
        return metrics

    from mtl_cog.launch import create_accelerator

    accelerator = create_accelerator()
    cfg, task_data, network = load_trained_run(accelerator, args.run)
    predictions = predict_split(accelerator, network, task_data.spec, task_data.splits[args.split],
                                cfg.train.eval_batch_size)
    metrics = score(predictions, args.bins or cfg.eval.bins)
    if accelerator.is_main_process:
        atomic_write_json(args.out, metrics)
    accelerator.print(format_table(metrics))
    accelerator.print(str(args.out))
    return metrics


if __name__ == "__main__":
    run_cli(main)
