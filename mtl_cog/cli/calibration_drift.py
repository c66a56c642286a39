"""How calibration drifts during training: the evidence that long cross-entropy training overconfides.

    python scripts/calibration_drift.py --config configs/synthetic/baseline.yaml [--every 5] [key=value ...]

Trains with ``mtl_cog.training.fit`` (the same loop, seeding, precision and data placement as
``scripts/train_mtl.py``; the run folder is an ordinary run, ``tracking=none``) and, every
``--every`` epochs, prints one JSON line with the validation metrics and the temperature that
post-hoc temperature scaling would fit to each task (T > 1: the model is overconfident, T < 1:
underconfident), plus the mean |logit| next to that of the true probabilities where the task
knows them (``synthetic``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from mtl_cog.config import load_config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import UserError, run_cli
from mtl_cog.evaluation.posthoc import fit_calibrator, layout_of
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.training import EpochEnd, Hooks, fit


def fitted_temperatures(layout: LogitLayout, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-task temperature of post-hoc temperature scaling on these (validation) predictions."""
    calibrator = CALIBRATORS.get("temperature")(layout).double()
    fit_calibrator(calibrator, torch.as_tensor(logits, dtype=torch.float64), torch.as_tensor(labels), layout)
    return calibrator.temperature.detach().numpy()


def drift_line(end: EpochEnd, layout: LogitLayout) -> dict:
    """One JSON-able line: validation metrics, fitted temperatures, logit magnitudes."""
    predictions, mean = end.val_predictions, end.val["mean"]
    flat = layout.join(predictions.logits)
    temperatures = fitted_temperatures(layout, flat, np.stack(predictions.labels, axis=1))
    line = {"epoch": end.epoch, "train_loss": round(end.train_loss, 4),
            **{f"val_{m}": round(mean[m], 4) for m in ("accuracy", "nll", "brier", "ece@15")},
            "fitted_T_median": round(float(np.median(temperatures)), 3),
            "tasks_with_T_above_1": int((temperatures > 1).sum()), "tasks": len(predictions.task_names),
            "mean_abs_logit": round(float(np.abs(flat).mean()), 3)}
    if predictions.true_probs is not None:
        p = np.clip(np.stack(predictions.true_probs, axis=1), 1e-7, 1 - 1e-7)
        line["true_mean_abs_logit"] = round(float(np.abs(np.log(p / (1 - p))).mean()), 3)
    return line


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--every", type=int, default=5, help="report every N epochs (and the last)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.every < 1:
        raise UserError(f"--every must be >= 1. Got {args.every}.")
    cfg = load_config(args.config, [*args.overrides, "tracking=none"])
    lines: list[dict] = []

    def on_epoch_end(end: EpochEnd) -> None:
        if end.stage != "stage_one" or (end.epoch % args.every and end.epoch != cfg.train.epochs):
            return
        line = drift_line(end, layout_of(end.val_predictions))
        if end.is_main_process:
            print(json.dumps(line), flush=True)
        lines.append(line)

    fit(cfg, hooks=Hooks(on_epoch_end=on_epoch_end))
    return lines


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
