#!/usr/bin/env python
"""Train a (multi-task) network with COG or a baseline, evaluate it, and save the run.

    accelerate launch scripts/train_mtl.py [--config configs/<dataset>/<method>.yaml] [key=value ...]
    accelerate launch scripts/train_mtl.py --resume RUN_DIR [key=value ...]   # continue a killed run

Without arguments it trains COG-FC on the built-in ``synthetic`` data (configs/synthetic/cog_fc.yaml).
The training state is saved at every epoch end (and every ``train.save_every_steps`` steps), so
``--resume`` continues from the last one; on the CPU the result equals an uninterrupted run.
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
from mtl_cog import resume, rundir  # noqa: E402
from mtl_cog.checkpoint import load_model, save_model  # noqa: E402
from mtl_cog.config import load_config, save_config  # noqa: E402
from mtl_cog.data import BatchTransform, place_split  # noqa: E402
from mtl_cog.engine import EpochProgress, is_better, train_one_epoch  # noqa: E402
from mtl_cog.errors import UserError, run_cli  # noqa: E402
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
    parser.add_argument("--config", type=Path, default=None, help=f"YAML experiment config (default {DEFAULT_CONFIG})")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last saved state (overrides apply on top)")
    parser.add_argument("--overwrite", action="store_true", help="replace a run folder that already holds a run")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=3 optim.leader_lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.resume is not None:
        if args.config is not None or args.overwrite:
            raise UserError("--resume continues a run with its saved config: no --config or --overwrite with it.")
        rundir.check_resumable(args.resume)
        cfg = load_config(args.resume / rundir.CONFIG, args.overrides)
        if args.overrides:
            print(f"resuming with changed settings: {' '.join(args.overrides)}")
    else:
        cfg = load_config(args.config or DEFAULT_CONFIG, args.overrides)
    accelerator = create_accelerator(log_with(cfg.tracking), cfg.train.precision)
    set_seed(cfg.seed)

    # ---- run folder: a new one (never silently over a previous run), or the one being resumed
    if args.resume is not None:
        run_dir, run_name = args.resume, args.resume.name
    else:
        # One run name for all processes (timestamps differ between them).
        name = [cfg.run_name or rundir.default_run_name(cfg.data.task, cfg.method.name, cfg.seed)]
        run_name = broadcast_object_list(name)[0] if accelerator.num_processes > 1 else name[0]
        run_dir = Path(cfg.output_dir) / run_name
        rundir.check_new_run(run_dir, args.overwrite)  # on every process, so all stop together
        accelerator.wait_for_everyone()
        if accelerator.is_main_process and args.overwrite:
            rundir.clear_run(run_dir)
    accelerator.print(f"run folder: {run_dir}")

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
    objective = build_objective(spec.layout, cfg.method).to(accelerator.device)
    optimizer = build_optimizer(network, cfg.method.leader, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim)  # stepped per epoch; not prepared (see optim.py)
    network, optimizer = accelerator.prepare(network, optimizer)
    if accelerator.is_main_process:  # only now: bad data or a bad model name leave no half-made run folder
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / rundir.CONFIG)
        atomic_write_json(run_dir / rundir.PARAMS, {"counts": counts, "leader": cfg.method.leader})
    accelerator.wait_for_everyone()
    tracker = Tracker(accelerator, run_dir, cfg.wandb_project, run_name, cfg.to_dict())
    train_transform = BatchTransform(spec, train=True, device=accelerator.device)

    # ---- resume: model, optimiser (both groups), scheduler, RNG states and progress, if saved
    model = accelerator.unwrap_model(network)
    progress = resume.restore_run(run_dir, model, optimizer, scheduler, accelerator.is_main_process)
    best, best_epoch = progress.best, progress.best_epoch
    if progress.epoch > 1 or progress.within.step:
        accelerator.print(f"resumed at epoch {progress.epoch}, step {progress.within.step} (best epoch {best_epoch})")

    def save_state(next_epoch: int, within: EpochProgress) -> None:
        if accelerator.is_main_process:
            lines = resume.count_lines(run_dir / rundir.METRICS)
            resume.save_training_state(run_dir / rundir.STATE, model, optimizer, scheduler,
                                       resume.Progress(next_epoch, within, best, best_epoch, lines))

    # ---- training: one epoch = train, validate, log, keep the best checkpoint, save the state
    for epoch in range(progress.epoch, cfg.train.epochs + 1):
        lrs = learning_rates(optimizer)
        stats = train_one_epoch(
            accelerator, network, objective, optimizer, train, train_transform, cfg.train.batch_size, cfg.seed, epoch,
            start=progress.within if epoch == progress.epoch else None, nonfinite=cfg.train.nonfinite,
            check_every=cfg.train.log_every_steps, save_every=cfg.train.save_every_steps,
            on_save=lambda within, epoch=epoch: save_state(epoch, within),
        )
        val_metrics = score(predict_split(accelerator, network, spec, val, cfg.train.eval_batch_size), cfg.eval.bins)
        selected = val_metrics["mean"][cfg.eval.selection_metric]
        improved = is_better(cfg.eval.selection_metric, selected, best)
        if improved:
            best, best_epoch = selected, epoch
        record = {"train_loss": stats["loss"], "lr": lrs, "val": val_metrics["mean"], "best_epoch": best_epoch,
                  "nonfinite_skipped": stats["skipped"]}
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
        # Order matters for resuming (mtl_cog/resume.py): metrics line, then state, then best model.
        save_state(epoch + 1, EpochProgress())
        if improved and accelerator.is_main_process:
            save_model(run_dir / rundir.BEST_MODEL, model, metadata={"epoch": str(epoch)})

    # Final evaluation with the best checkpoint (validation Brier by default), on every process.
    accelerator.wait_for_everyone()
    # A resumed TST/V-TST run may have been killed in stage two, after best_model was replaced by
    # the stage-two network: its stage-one weights are then in STAGE_ONE_MODEL.
    stage_one = run_dir / rundir.STAGE_ONE_MODEL
    load_model(stage_one if cfg.two_stage.enabled and stage_one.exists() else run_dir / rundir.BEST_MODEL, model)
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
    publish_final_report(accelerator, run_dir, tracker.enabled)  # reliability PNG + per-task table
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
