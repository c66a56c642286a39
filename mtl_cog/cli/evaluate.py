"""Score predictions: any prediction file, or a run's best checkpoint re-evaluated.

    python scripts/evaluate.py --predictions FILE.npz [--bins 5 10 15 20 50] --out metrics.json
    accelerate launch scripts/evaluate.py --run RUN_DIR [--split test] --out metrics.json [--unfinished]
    python scripts/evaluate.py --run RUN_DIR --posthoc ts vs ms svs sms isotonic histogram

With ``--posthoc``, each named calibrator is fitted (one per task) on the run's
predictions_val.npz and applied to its predictions_test.npz, without re-running the network
(except ``stability``, which runs the run's network on perturbed validation and test images:
mtl_cog/evaluation/stability.py; it needs the data set);
RUN_DIR/posthoc_metrics.csv gets one row per (method, task) with method "none" for the
uncalibrated predictions, and RUN_DIR/predictions_test_<method>.npz the calibrated predictions.

The JSON is {"tasks": {task: {metric: value}}, "mean": {metric: value}, "multitask": {metric:
value}, "pairs": [...]}. Per task (and their mean): accuracy, nll, brier, ece@B, rmsce@B, mce@B,
smece, adaece@B, brier_reliability, brier_resolution, brier_uncertainty, and classwise_ece@B for
K-class tasks. "multitask" (two or more tasks): pooled_ece@B, worst_task_ece@B, p90_task_ece@B,
and with two or more binary tasks count_ece and pair_joint_ece; "pairs" lists the joint
calibration of each of the --pairs most correlated attribute pairs. Formulas: docs/metrics.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtl_cog.config.arguments import Parser, whole_number
from mtl_cog.config.schema import check_bins
from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.data.loading import load_task
from mtl_cog.errors import UserError, run_cli
from mtl_cog.evaluation.assess import AssessSettings, assess, assess_split
from mtl_cog.evaluation.metrics import format_table
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.predictions import load_predictions
from mtl_cog.io import atomic_write_json, check_writable
from mtl_cog.reporting.posthoc_run import fit_posthoc_run, posthoc_method_names
from mtl_cog.runs.trained import check_same_spec, load_network, open_finished_run, run_task_spec
from mtl_cog.training.accelerator import create_accelerator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--predictions", type=Path,
                        help="a prediction file (.npz, see mtl_cog/evaluation/predictions.py)")
    source.add_argument("--run", type=Path, help="a run folder: re-evaluate its best checkpoint")
    parser.add_argument("--split", choices=["train", "val", "test"], default="test", help="with --run")
    parser.add_argument("--unfinished", action="store_true",
                        help="with --run: score the last best checkpoint of a run that has not finished (no DONE); "
                        "without it such a run is refused, since its checkpoint is not the run's result")
    parser.add_argument("--bins", type=int, nargs="+", default=None, help=f"bin counts (default {list(DEFAULT_BINS)})")
    parser.add_argument("--pairs", type=whole_number(0, None, "a pair count >= 0"), default=None,
                        help="attribute pairs scored by pair_joint_ece (default: the run's eval.joint_pairs, "
                        f"else {DEFAULT_PAIRS}; 0 = none)")
    parser.add_argument("--out", type=Path, help="where to write the metrics JSON (required without --posthoc)")
    parser.add_argument("--posthoc", nargs="+", choices=posthoc_method_names(), metavar="METHOD",
                        help="with --run: fit post-hoc calibrators on the validation predictions, score them on the "
                        f"test predictions ({', '.join(posthoc_method_names())})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.bins is not None:
        check_bins(args.bins, "--bins")
    if args.out is not None:
        check_writable(args.out, "--out")  # before the work, not after it
    if args.posthoc:
        if args.run is None:
            raise UserError("--posthoc needs --run RUN_DIR (it reads the run's validation and test predictions).")
        return fit_posthoc_run(args.run, args.posthoc, args.bins, args.out, args.pairs)
    if args.out is None:
        raise UserError("--out is required (where to write the metrics JSON).")
    if args.predictions is not None:
        settings = AssessSettings(args.bins or list(DEFAULT_BINS), DEFAULT_PAIRS if args.pairs is None else args.pairs)
        metrics = assess(load_predictions(args.predictions), settings).metrics
        print(format_table(metrics))
        atomic_write_json(args.out, metrics)
        print(args.out)
        return metrics

    cfg = open_finished_run(args.run, args.unfinished, "--unfinished")  # DONE + the files it wrote
    accelerator = create_accelerator()
    with accelerator.main_process_first():  # the main process builds any data cache first
        task_data = load_task(cfg.data)
    check_same_spec(run_task_spec(cfg, args.run), task_data.spec, args.run)
    network = load_network(cfg, task_data.spec, args.run).to(accelerator.device)
    # the sequence fit ends with (mtl_cog.evaluation.assess): predict, score, certify and any other add-on
    metrics = assess_split(accelerator, network, task_data.spec, task_data.splits[args.split],
                           cfg.train.eval_batch_size, AssessSettings.of_run(cfg, args.bins, args.pairs)).metrics
    if accelerator.is_main_process:
        atomic_write_json(args.out, metrics)
    accelerator.print(format_table(metrics))
    accelerator.print(str(args.out))
    return metrics


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
