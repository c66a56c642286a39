"""How calibration drifts during training, beside the sharpness of the loss and the margins.

    python scripts/calibration_drift.py --config configs/synthetic/baseline.yaml [--every 5]
    python scripts/calibration_drift.py --data synthetic --method baseline [--config extra.yaml] ...   # the same
        [--curvature top_eigenvalue|trace|both|none] [--curvature-batch 256] [--curvature-iterations 20]
        [key=value ...]

Trains with ``mtl_cog.training.fit`` (the same loop, seeding, precision and data placement as
``scripts/train_mtl.py``; the run folder is an ordinary run, ``tracking=none``) and, every
``--every`` epochs (and at the last), prints one JSON line with:

- the validation metrics (accuracy, NLL, Brier, ECE@15, smooth ECE, and the pooled ECE and count
  ECE of multi-task data) and the temperature that post-hoc temperature scaling would fit to
  each task (T > 1: the model is overconfident, T < 1: underconfident), the mean |logit| next to
  that of the true probabilities where the task knows them (``synthetic``);
- the curvature of the training NLL on a fixed batch (the first ``--curvature-batch`` training
  images, without augmentation, the same at every epoch): the top eigenvalue of the generalised
  Gauss–Newton matrix by power iteration and/or its trace by Hutchinson's estimator
  (mtl_cog.evaluation.sharpness; ``--curvature-iterations`` products or samples);
- quantiles of the signed margins of the validation labels (the tails: confident mistakes and
  confident hits).

At the end it writes the lines to ``calibration_drift.jsonl`` and one figure,
``calibration_drift.png`` (ECE, curvature, margins and temperature over epochs, shared x axis),
into the run folder, and prints the Spearman rank correlation of ECE with the curvature over the
reported epochs: whether ECE tracks sharpness on this data.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch
from scipy.stats import spearmanr

from mtl_cog.cli.config_args import add_config_arguments, add_out_argument, given, overrides, resolve_files
from mtl_cog.config import load_config
from mtl_cog.config.arguments import Parser, whole_number
from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import run_cli
from mtl_cog.evaluation.predictions import layout_of
from mtl_cog.evaluation.sharpness import hutchinson_trace, margin_quantiles, top_eigenvalue
from mtl_cog.io import atomic_write_text
from mtl_cog.models.calibrators import fit_temperatures
from mtl_cog.reporting.plots import drift_figure, save_figure
from mtl_cog.runs import rundir
from mtl_cog.training import EpochEnd, Hooks, fit

CURVATURE = ("top_eigenvalue", "trace", "both", "none")


def _round(value: float, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), digits)


def drift_line(end: EpochEnd, layout: LogitLayout) -> dict:
    """One JSON-able line: validation metrics, fitted temperatures, logit magnitudes, margin quantiles."""
    predictions, mean, multitask = end.val_predictions, end.val["mean"], end.val.get("multitask", {})
    flat = layout.join(predictions.logits)
    temperatures = fit_temperatures(layout, predictions.logits, predictions.labels, predictions.task_names,
                                    what=f"calibration drift, epoch {end.epoch}").numpy()
    fitted = temperatures[np.isfinite(temperatures)]  # NaN: no validation errors, so no optimal T
    ece = f"ece@{SUMMARY_BINS}" if f"ece@{SUMMARY_BINS}" in mean else next(k for k in mean if k.startswith("ece@"))
    line = {"epoch": end.epoch, "train_loss": _round(end.train_loss, 4),
            **{f"val_{m}": _round(mean[m], 4) for m in ("accuracy", "nll", "brier", ece, "smece")},
            **{f"val_{m}": _round(multitask[m], 4) for m in (f"pooled_{ece}", "count_ece") if m in multitask},
            "fitted_T_median": _round(float(np.median(fitted)) if fitted.size else None, 3),
            "tasks_with_T_above_1": int((fitted > 1).sum()),
            "tasks_without_T_optimum": int((~np.isfinite(temperatures)).sum()),
            "tasks": len(predictions.task_names),
            "mean_abs_logit": _round(float(np.abs(flat).mean()), 3)}
    if predictions.true_probs is not None:
        p = np.clip(np.stack(predictions.true_probs, axis=1), 1e-7, 1 - 1e-7)
        line["true_mean_abs_logit"] = _round(float(np.abs(np.log(p / (1 - p))).mean()), 3)
    line.update({f"val_{k}": _round(v, 3) for k, v in margin_quantiles(predictions.logits, predictions.labels).items()})
    return line


def curvature_line(model: torch.nn.Module, images: torch.Tensor, layout: LogitLayout, kind: str,
                   iterations: int) -> dict:
    """The GGN summaries asked for, on the fixed batch (already on the model's device, preprocessed)."""
    line = {}
    if kind in ("top_eigenvalue", "both"):
        value, used = top_eigenvalue(model, images, layout, iterations=iterations)
        line.update(ggn_top_eigenvalue=_round(value, 6), ggn_power_iterations=used)
    if kind in ("trace", "both"):
        value, stderr = hutchinson_trace(model, images, layout, samples=iterations)
        line.update(ggn_trace=_round(value, 6), ggn_trace_stderr=_round(stderr, 6))
    return line


def ece_curvature_correlation(lines: list[dict], ece_key: str) -> dict[str, float]:
    """Spearman ρ over the reported epochs between validation ECE and each curvature summary (>= 3 epochs)."""
    out = {}
    for key in ("ggn_top_eigenvalue", "ggn_trace"):
        pairs = [(line[ece_key], line[key]) for line in lines if line.get(key) is not None
                 and line.get(ece_key) is not None]
        if len(pairs) >= 3:
            rho = spearmanr(*zip(*pairs)).statistic
            out[f"spearman_{ece_key}_vs_{key}"] = _round(float(rho), 3)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, default=False)
    add_out_argument(parser)
    parser.add_argument("--every", type=whole_number(1, None, "epochs >= 1"), default=5,
                        help="report every N epochs (and the last)")
    parser.add_argument("--curvature", choices=CURVATURE, default="top_eigenvalue",
                        help="GGN summary of the training NLL on a fixed batch (default top_eigenvalue)")
    parser.add_argument("--curvature-batch", type=whole_number(1, None, "images >= 1"), default=256,
                        help="the first N training images form the fixed batch (default 256)")
    parser.add_argument("--curvature-iterations", type=whole_number(1, None, "iterations >= 1"), default=20,
                        help="power-iteration steps (at most) or Hutchinson samples (default 20)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if not given(args):
        parser.error("give --config, or --data and --method")
    return args


class FixedBatch:
    """The first N training images, preprocessed for evaluation, on the model's device: loaded at first use.

    Loaded inside the first hook call, on the main process, after ``fit`` has built any data
    cache (so processes never race to build it); only the N images are kept.
    """

    def __init__(self, data_cfg, size: int) -> None:
        self.data_cfg, self.size = data_cfg, size
        self._batch: torch.Tensor | None = None

    def on(self, device: torch.device) -> torch.Tensor:
        if self._batch is None:
            task_data = load_task(self.data_cfg)
            images = task_data.splits["train"].images[: self.size].clone()
            self._batch = BatchTransform(task_data.spec, train=False, device=device)(images.to(device))
        return self._batch


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    cfg = load_config(resolve_files(args, default=False), [*overrides(args), "tracking=none"])
    batch = None if args.curvature == "none" else FixedBatch(cfg.data, args.curvature_batch)
    lines: list[dict] = []

    def on_epoch_end(end: EpochEnd) -> None:
        if end.stage != "stage_one" or (end.epoch % args.every and end.epoch != cfg.train.epochs):
            return
        if not end.is_main_process:  # every process holds the same weights: one measures
            return
        layout = layout_of(end.val_predictions)
        line = drift_line(end, layout)
        if batch is not None:
            images = batch.on(next(end.model.parameters()).device)
            line.update(curvature_line(end.model, images, layout, args.curvature, args.curvature_iterations))
        print(json.dumps(line), flush=True)
        lines.append(line)

    result = fit(cfg, hooks=Hooks(on_epoch_end=on_epoch_end))
    if lines:  # the main process
        ece_key = next(k for k in lines[0] if k.startswith("val_ece@"))
        summary = ece_curvature_correlation(lines, ece_key)
        if summary:
            print(json.dumps(summary), flush=True)
        atomic_write_text(result.run_dir / rundir.DRIFT_JSONL, "".join(json.dumps(line) + "\n" for line in lines))
        rho = ", ".join(f"{k.split('_vs_')[1]} ρ = {v}" for k, v in summary.items())
        title = f"Calibration drift: {result.run_dir.name}" + (f"\nSpearman(ECE, {rho})" if rho else "")
        save_figure(drift_figure(lines, title, ece_key), result.run_dir / rundir.DRIFT_PNG)
        print(result.run_dir / rundir.DRIFT_PNG)
    return lines


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
