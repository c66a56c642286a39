#!/usr/bin/env python
"""Train a (multi-task) network with COG or a baseline, evaluate it, and save the run.

    accelerate launch scripts/train_mtl.py [--config configs/<dataset>/<method>.yaml] [key=value ...]

Without arguments it trains COG-FC on the built-in ``synthetic`` data (configs/synthetic/cog_fc.yaml).
Works the same under plain ``python`` and under ``accelerate launch`` with any number of processes.
The last line printed is the run folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a clone without installing

from accelerate.utils import broadcast_object_list, set_seed  # noqa: E402

import tasks  # noqa: E402,F401  (registers the data sets)
from mtl_cog import rundir  # noqa: E402
from mtl_cog.checkpoint import load_model, save_model  # noqa: E402
from mtl_cog.config import load_config, save_config  # noqa: E402
from mtl_cog.data import BatchTransform, place_split  # noqa: E402
from mtl_cog.engine import is_better, train_one_epoch  # noqa: E402
from mtl_cog.errors import run_cli  # noqa: E402
from mtl_cog.evaluation import predict_split, score  # noqa: E402
from mtl_cog.io import atomic_write, atomic_write_json, atomic_write_text  # noqa: E402
from mtl_cog.launch import create_accelerator  # noqa: E402
from mtl_cog.metrics import format_table, metrics_frame  # noqa: E402
from mtl_cog.models import build_network, parameter_counts  # noqa: E402
from mtl_cog.objectives import build_objective  # noqa: E402
from mtl_cog.optim import build_optimizer, build_scheduler, learning_rates  # noqa: E402
from mtl_cog.performance import apply_speed_options  # noqa: E402
from mtl_cog.predictions import save_predictions  # noqa: E402
from mtl_cog.task_api import load_task  # noqa: E402
from mtl_cog.tracking import Tracker, flatten_metrics, log_with  # noqa: E402
from mtl_cog.two_stage import run_second_stage  # noqa: E402
from mtl_cog.wandb_report import publish_final_report  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "synthetic" / "cog_fc.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="YAML experiment config")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3 optim.leader_lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    accelerator = create_accelerator(log_with(cfg.tracking), cfg.train.precision)
    set_seed(cfg.seed)

    # One run name for all processes (timestamps differ between them).
    name = [cfg.run_name or rundir.default_run_name(cfg.data.task, cfg.method.name, cfg.seed)]
    run_name = broadcast_object_list(name)[0] if accelerator.num_processes > 1 else name[0]
    run_dir = Path(cfg.output_dir) / run_name
    if accelerator.is_main_process:
        if (run_dir / rundir.DONE).exists():
            raise FileExistsError(f"{run_dir} already holds a finished run; choose another run_name.")
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / rundir.CONFIG)

    with accelerator.main_process_first():  # the main process builds any data cache first
        task_data = load_task(cfg.data)
    spec, train, val, test = task_data.spec, *(task_data.splits[s] for s in ("train", "val", "test"))
    train = place_split(train, accelerator.device) if cfg.train.images_on_device else train

    network = apply_speed_options(build_network(cfg.model, cfg.method, spec.layout), cfg.train)
    counts = parameter_counts(network)
    leader = "+".join(cfg.method.leader) or "none (standard training)"
    accelerator.print(f"method {cfg.method.name}: leader = {leader}; parameters {counts}")
    accelerator.print(
        f"data {spec.dataset}: {spec.num_tasks} task(s), train/val/test = {len(train)}/{len(val)}/{len(test)}"
    )
    if accelerator.is_main_process:
        atomic_write_json(run_dir / rundir.PARAMS, {"counts": counts, "leader": cfg.method.leader})
    objective = build_objective(spec.layout, cfg.method).to(accelerator.device)
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim)  # stepped per epoch; not prepared (see optim.py)
    network, optimizer = accelerator.prepare(network, optimizer)
    tracker = Tracker(accelerator, run_dir, cfg.wandb_project, run_name, cfg.to_dict())
    train_transform = BatchTransform(spec, train=True, device=accelerator.device)

    best, best_epoch = None, 0
    for epoch in range(1, cfg.train.epochs + 1):
        lrs = learning_rates(optimizer)
        stats = train_one_epoch(
            accelerator, network, objective, optimizer, train, train_transform, cfg.train.batch_size, cfg.seed, epoch
        )
        val_metrics = score(predict_split(accelerator, network, spec, val, cfg.train.eval_batch_size), cfg.eval.bins)
        selected = val_metrics["mean"][cfg.eval.selection_metric]
        if is_better(cfg.eval.selection_metric, selected, best):
            best, best_epoch = selected, epoch
            if accelerator.is_main_process:
                save_model(run_dir / rundir.BEST_MODEL, accelerator.unwrap_model(network))
        record = {"train_loss": stats["loss"], "lr": lrs, "val": val_metrics["mean"], "best_epoch": best_epoch}
        flat = {
            "train/loss": stats["loss"],
            **{f"lr/{k}": v for k, v in lrs.items()},
            **flatten_metrics("val", val_metrics),
        }
        tracker.log_epoch(epoch, {**record, "val_tasks": val_metrics["tasks"]}, flat)
        mean = val_metrics["mean"]
        accelerator.print(
            f"epoch {epoch:3d}/{cfg.train.epochs}  loss {stats['loss']:.4f}  val acc {mean['accuracy']:.4f}"
            f"  nll {mean['nll']:.4f}  brier {mean['brier']:.4f}  ece@15 {mean['ece@15']:.4f}"
            f"{'  *' if best_epoch == epoch else ''}"
        )
        scheduler.step()

    # Final evaluation with the best checkpoint (validation Brier by default), on every process.
    accelerator.wait_for_everyone()
    model = accelerator.unwrap_model(network)
    load_model(run_dir / rundir.BEST_MODEL, model)
    if cfg.two_stage.enabled:  # TST / V-TST: train a new head on the frozen backbone (mtl_cog/two_stage.py)
        network = run_second_stage(accelerator, model, objective, spec, train, val, cfg.two_stage, cfg.train,
                                   cfg.seed, run_dir)
    results = {}
    for split_name, split in (("val", val), ("test", test)):
        predictions = predict_split(accelerator, network, spec, split, cfg.train.eval_batch_size)
        results[split_name] = score(predictions, cfg.eval.bins)
        if accelerator.is_main_process:
            save_predictions(run_dir / rundir.predictions_file(split_name), predictions)
    tracker.log_epoch(
        cfg.train.epochs + 1,
        {"final": True, "best_epoch": best_epoch, "test": results["test"]["mean"]},
        flatten_metrics("test", results["test"]),
    )
    if accelerator.is_main_process:
        frame = metrics_frame(results["test"])
        atomic_write(run_dir / rundir.TEST_METRICS, lambda tmp: frame.to_csv(tmp, index=False))
        atomic_write_text(run_dir / rundir.DONE, f"best_epoch={best_epoch}\n")
    publish_final_report(accelerator, run_dir, tracker.enabled)  # reliability PNG + per-task table (W&B and run folder)
    tracker.finish()
    accelerator.print(
        f"\ntest metrics of the best checkpoint (epoch {best_epoch}, by validation {cfg.eval.selection_metric}):"
    )
    accelerator.print(format_table(results["test"]))
    accelerator.print(f"run folder: {run_dir}")
    accelerator.print(str(run_dir))
    return run_dir


if __name__ == "__main__":
    run_cli(main)
