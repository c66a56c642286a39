"""Score predictions: any prediction file, or a run's best checkpoint re-evaluated.

    python scripts/evaluate.py --predictions FILE.npz [--bins 5 10 15 20 50] --out metrics.json
    accelerate launch scripts/evaluate.py --run RUN_DIR [--split test] --out metrics.json [--unfinished]
    python scripts/evaluate.py --run RUN_DIR --posthoc ts vs ms svs sms isotonic histogram
    mtl-cog evaluate --run RUN_DIR --posthoc ts vs isotonic    # temperature, vector scaling, isotonic regression

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
calibration of each of the --pairs most correlated attribute pairs. Formulas: docs/explanation/metrics.md.

    python scripts/evaluate.py --run RUN_DIR --shift [CORRUPTION ...] [--severities 1-5] [--suite S] [--posthoc ts]

With ``--shift``, the run's network predicts the test split under each named corruption of
Hendrycks & Dietterich (none named: all 15) at each severity, every corrupted split built once
into the data cache, with the severity parameters of ``--suite`` (cifar10c: CIFAR-10-C's; imagenetc:
ImageNet-C's; default: the run's eval.shift_suite, auto = cifar10c up to 64 px);
``--posthoc`` calibrators are fitted on the clean validation predictions and
applied under shift. RUN_DIR/shift_metrics.csv gets every metric per method x corruption x
severity x task (and the task mean), RUN_DIR/shift_test.png accuracy, NLL and ECE@15 against
severity (docs/guides/shift.md). ``--groups TASK ...`` adds per-group metrics and multicalibration
(docs/explanation/metrics.md) to the JSON ("groups") and, with --run, writes RUN_DIR/group_metrics.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from mtl_cog.config.arguments import Parser, whole_number
from mtl_cog.config.schema import check_bins, check_corruptions, check_severities
from mtl_cog.constants import DEFAULT_BINS, SHIFT_SUITES
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import UserError, run_cli
from mtl_cog.evaluation.assess import AssessSettings, assess, assess_split
from mtl_cog.evaluation.binning import CLAMP
from mtl_cog.evaluation.groups import check_groups
from mtl_cog.evaluation.inference import predict_split
from mtl_cog.evaluation.metrics import format_table
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.posthoc import POSTHOC, POSTHOC_METHODS
from mtl_cog.evaluation.predictions import Predictions, labelled_rows, load_predictions
from mtl_cog.evaluation.shift import evaluate_shift, summary
from mtl_cog.io import atomic_write_json, check_writable
from mtl_cog.reporting.posthoc_run import fit_posthoc_run, posthoc_method_names
from mtl_cog.reporting.shift_report import write_group_files, write_shift_files
from mtl_cog.runs import rundir
from mtl_cog.runs.finished import check_finished_run
from mtl_cog.runs.trained import NETWORK_FILES, check_same_spec, load_network, run_task_spec
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
                        f"test predictions ({', '.join(map(posthoc_title, posthoc_method_names()))})")
    parser.add_argument("--shift", nargs="*", metavar="CORRUPTION", default=None,
                        help="with --run: score the test split under these corruptions (none named: all 15)")
    parser.add_argument("--severities", default=None,
                        help="with --shift: 1-5, 1,3,5 or 3 (default: the run's eval.shift_severities)")
    parser.add_argument("--suite", choices=["auto", *SHIFT_SUITES], default=None,
                        help="with --shift: whose severity parameters (default: the run's eval.shift_suite)")
    parser.add_argument("--groups", nargs="+", metavar="TASK",
                        help="per-group metrics and multicalibration, groups defined by these tasks' labels")
    return parser.parse_args(argv)


def posthoc_title(name: str) -> str:
    """``vs (vector scaling)``: a post-hoc method's short name with what it stands for."""
    title = POSTHOC.get(name).title
    return f"{name} ({title})" if title else name


def certain_mistakes_note(method: str, predictions: Predictions) -> str | None:
    """What a calibrator's NLL means when it gives some test labels probability ~0 (None when it gives none).

    Binning calibrators (isotonic, histogram) map a whole score range to the one frequency they saw
    there on the validation set, 0 or 1 at the ends (probmetrics writes them as logits of +-69, a
    probability of 1e-30); every test label in such a range that goes the other way costs 69 nats. A
    handful of them dominate the mean NLL, which then counts certain mistakes, not miscalibration.
    """
    certain, total, cost = 0, 0, 0.0
    for logits, labels in zip(predictions.logits, predictions.labels):
        z, y = labelled_rows(np.asarray(logits, dtype=np.float64), np.asarray(labels))
        if z.ndim == 1:  # binary: the logit of the positive class
            log_p = -np.logaddexp(0.0, np.where(y == 1, -z, z))
        else:
            log_p = z[np.arange(len(y)), y.astype(np.int64)] - np.logaddexp.reduce(z, axis=1)
        wrong = log_p <= np.log(CLAMP)
        certain, total, cost = certain + int(wrong.sum()), total + len(y), cost - float(log_p[wrong].sum())
    if certain == 0:
        return None
    return (f"note: {method} gave {certain:,} of {total:,} test labels ({certain / total:.1%}) probability ~0; "
            f"they add about {cost / total:.2f} to its NLL: that NLL counts those certain mistakes, not its "
            "calibration; compare it on ECE and Brier.")


def parse_severities(text: str) -> list[int]:
    """"1-5" | "1,3,5" | "3" -> [1, ..., 5] | [1, 3, 5] | [3]; anything else is refused (one error line)."""
    try:
        if "-" in text:
            low, high = (int(v) for v in text.split("-"))
            values = list(range(low, high + 1)) if low <= high else []
        else:
            values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"--severities: {text!r} is not a range like 1-5 or a list like 1,3,5.") from None
    check_severities(values, "--severities")
    return values


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.bins is not None:
        check_bins(args.bins, "--bins")
    if args.out is not None:
        check_writable(args.out, "--out")  # before the work, not after it
    if args.unfinished and (args.shift is not None or args.posthoc):
        raise UserError("--unfinished goes with --run RUN_DIR --out FILE only: --shift and --posthoc write their "
                        "results into the run folder, which only a finished run's may hold.")
    if args.shift is not None:
        if args.run is None:
            raise UserError("--shift needs --run RUN_DIR (it runs the run's network on corrupted test images).")
        names = check_corruptions(args.shift or ["all"], "--shift")
        return run_shift(args.run, names, args.severities, args.posthoc or [], args.bins, args.out, args.suite)
    if args.severities is not None or args.suite is not None:
        raise UserError("--severities and --suite go with --shift.")
    if args.posthoc:
        if args.run is None:
            raise UserError("--posthoc needs --run RUN_DIR (it reads the run's validation and test predictions).")
        print(f"post-hoc calibrators: {', '.join(map(posthoc_title, args.posthoc))}")
        results = fit_posthoc_run(args.run, args.posthoc, args.bins, args.out, args.pairs)
        for name in args.posthoc:
            note = certain_mistakes_note(name, load_predictions(args.run / rundir.posthoc_predictions_file("test",
                                                                                                          name)))
            if note:
                print(note)
        return results
    if args.out is None:
        raise UserError("--out is required (where to write the metrics JSON).")
    if args.predictions is not None:
        settings = AssessSettings(args.bins or list(DEFAULT_BINS), DEFAULT_PAIRS if args.pairs is None else args.pairs,
                                  groups=tuple(args.groups or ()))
        if rundir.is_run_folder(args.predictions.parent):  # a run's own file: the one the run wrote
            check_finished_run(args.predictions.parent, [args.predictions.name], allow_unfinished=True)
        predictions = load_predictions(args.predictions)
        check_groups(list(settings.groups), predictions.task_names, "--groups")
        metrics = assess(predictions, settings).metrics
        print(format_table(metrics))
        atomic_write_json(args.out, metrics)
        print(args.out)
        return metrics

    cfg = check_finished_run(args.run, NETWORK_FILES, args.unfinished, "--unfinished")  # DONE + the files it wrote
    accelerator = create_accelerator(timeout_s=cfg.train.dist_timeout_s)
    with accelerator.main_process_first():  # the main process builds any data cache first
        task_data = load_task(cfg.data)
    check_same_spec(run_task_spec(cfg, args.run), task_data.spec, args.run)
    check_groups(args.groups or [], task_data.spec.task_names, "--groups")  # before the network runs
    network = load_network(cfg, task_data.spec, args.run).to(accelerator.device)
    # the sequence fit ends with (mtl_cog.evaluation.assess): predict, score, certify and any other add-on
    metrics = assess_split(accelerator, network, task_data.spec, task_data.splits[args.split],
                           cfg.train.eval_batch_size,
                           AssessSettings.of_run(cfg, args.bins, args.pairs, groups=args.groups)).metrics
    if accelerator.is_main_process:
        atomic_write_json(args.out, metrics)
        if args.groups:
            accelerator.print(write_group_files(args.run, metrics["groups"]))
    accelerator.print(format_table(metrics))
    accelerator.print(str(args.out))
    return metrics


def run_shift(run_dir: Path, names: list[str], severities: str | None, posthoc: list[str], bins: list[int] | None,
              out: Path | None, suite: str | None = None) -> dict:
    """The run's network on the test split under each corruption and severity -> shift_metrics.csv + figure."""
    unsupported = [m for m in posthoc if m not in POSTHOC_METHODS]
    if unsupported:
        raise UserError(f"--posthoc {' '.join(unsupported)} cannot be combined with --shift (it re-runs the network "
                        f"on perturbed images of its own); use {', '.join(POSTHOC_METHODS)}.")
    levels = parse_severities(severities) if severities else None  # a bad range fails before anything loads
    val_file = rundir.predictions_file("val")
    cfg = check_finished_run(run_dir, [*NETWORK_FILES, *([val_file] if posthoc else [])])  # DONE + its files
    accelerator = create_accelerator(timeout_s=cfg.train.dist_timeout_s)
    levels = levels or list(cfg.eval.shift_severities)
    val = load_predictions(run_dir / val_file) if posthoc else None  # before the work
    with accelerator.main_process_first():
        task_data = load_task(cfg.data)
    spec, test = task_data.spec, task_data.splits["test"]
    network = load_network(cfg, spec, run_dir).to(accelerator.device)
    clean = predict_split(accelerator, network, spec, test, cfg.train.eval_batch_size)
    eval_cfg = dataclasses.replace(cfg.eval, bins=bins or cfg.eval.bins, shift_suite=suite or cfg.eval.shift_suite)
    frame = evaluate_shift(accelerator, network, TASKS.get(cfg.data.task), spec, cfg.data, eval_cfg, test, clean, val,
                           names, levels, posthoc, cfg.train.eval_batch_size)
    if accelerator.is_main_process:
        csv, png = write_shift_files(run_dir, frame)
        if out is not None:
            atomic_write_json(out, {"rows": frame.to_dict("records")})
        print(f"test metrics under corruption, {frame.suite.iloc[0]} severities "
              "(mean over tasks, then over corruptions; severity 0 = clean):")
        print(summary(frame).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print(png)
        print(csv)
    return {"rows": frame.to_dict("records")}


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
