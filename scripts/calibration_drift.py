#!/usr/bin/env python
"""How calibration drifts during training: the evidence that long cross-entropy training overconfides.

    python scripts/calibration_drift.py --config configs/synthetic/baseline.yaml [--every 5] [key=value ...]

Trains like ``scripts/train_mtl.py`` (same modules, one process, nothing saved) and, every
``--every`` epochs, prints one JSON line with the validation metrics and the temperature that
post-hoc temperature scaling would fit to each task (T > 1: the model is overconfident, T < 1:
underconfident), plus the mean |logit| next to that of the true probabilities where the task
knows them (``synthetic``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tasks  # noqa: E402,F401  (registers the data sets)
from mtl_cog.calibrators import CALIBRATORS  # noqa: E402
from mtl_cog.config import load_config  # noqa: E402
from mtl_cog.data import BatchTransform  # noqa: E402
from mtl_cog.engine import train_one_epoch  # noqa: E402
from mtl_cog.errors import UserError, run_cli  # noqa: E402
from mtl_cog.evaluation import predict_split, score  # noqa: E402
from mtl_cog.launch import create_accelerator  # noqa: E402
from mtl_cog.models import build_network  # noqa: E402
from mtl_cog.objectives import build_objective  # noqa: E402
from mtl_cog.optim import build_optimizer, build_scheduler  # noqa: E402
from mtl_cog.posthoc import fit_calibrator  # noqa: E402
from mtl_cog.task_api import load_task  # noqa: E402


def fitted_temperatures(layout, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-task temperature of post-hoc temperature scaling on these (validation) predictions."""
    calibrator = CALIBRATORS.get("temperature")(layout).double()
    fit_calibrator(calibrator, torch.as_tensor(logits, dtype=torch.float64), torch.as_tensor(labels), layout)
    return calibrator.temperature.detach().numpy()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--every", type=int, default=5, help="report every N epochs (and the last)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.every < 1:
        raise UserError(f"--every must be >= 1. Got {args.every}.")
    cfg = load_config(args.config, [*args.overrides, "tracking=none"])
    accelerator = create_accelerator()
    torch.manual_seed(cfg.seed)
    data = load_task(cfg.data)
    spec, train, val = data.spec, data.splits["train"], data.splits["val"]
    network = build_network(cfg.model, cfg.method, spec.layout)
    objective = build_objective(spec.layout, cfg.method)
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim)
    network, optimizer = accelerator.prepare(network, optimizer)
    transform = BatchTransform(spec, train=True, device=accelerator.device)
    true_abs_logit = None
    if val.true_probs is not None:
        p = np.clip(val.true_probs, 1e-7, 1 - 1e-7)
        true_abs_logit = float(np.abs(np.log(p / (1 - p))).mean())
    lines = []
    for epoch in range(1, cfg.train.epochs + 1):
        stats = train_one_epoch(accelerator, network, objective, optimizer, train, transform, cfg.train.batch_size,
                                cfg.seed, epoch)
        scheduler.step()
        if epoch % args.every and epoch != cfg.train.epochs:
            continue
        predictions = predict_split(accelerator, network, spec, val, cfg.train.eval_batch_size)
        mean = score(predictions, cfg.eval.bins)["mean"]
        flat = spec.layout.join(predictions.logits)
        temperatures = fitted_temperatures(spec.layout, flat, np.stack(predictions.labels, axis=1))
        line = {"epoch": epoch, "train_loss": round(stats["loss"], 4),
                **{f"val_{m}": round(mean[m], 4) for m in ("accuracy", "nll", "brier", "ece@15")},
                "fitted_T_median": round(float(np.median(temperatures)), 3),
                "tasks_with_T_above_1": int((temperatures > 1).sum()), "tasks": spec.num_tasks,
                "mean_abs_logit": round(float(np.abs(flat).mean()), 3)}
        if true_abs_logit is not None:
            line["true_mean_abs_logit"] = round(true_abs_logit, 3)
        print(json.dumps(line), flush=True)
        lines.append(line)
    return lines


if __name__ == "__main__":
    run_cli(main)
