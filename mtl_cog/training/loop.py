"""``fit(cfg)``: one whole run, the only training loop of the project.

A run is: open (or resume) the run folder, load the data, build network, objective and
optimiser, train stage one epoch by epoch (validate, log, keep the best checkpoint, save the
resumable state), for two-stage methods (TST, V-TST) train a new head on the frozen backbone
with the *same* epoch loop, then hand the best network to ``mtl_cog.reporting.end_of_run.finish_run`` (assess validation
and test, save the predictions and the per-task table, report, mark the run ``DONE``). The
network, objective and optimiser come from ``mtl_cog.training.trainee.build_trainee``, the
assembly the benchmarks time.

Callers that need more than the run folder pass ``Hooks`` (for example
``scripts/calibration_drift.py`` reads the validation predictions after every epoch); nothing
else differs between them. The write order at the end of an epoch (metrics line, then state,
then best model) is what lets ``mtl_cog.runs.training_state.restore_run`` repair a run killed
at any moment; the data flow of one step and of one evaluation is in ``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from torch import nn

from mtl_cog.config import Config, EvalConfig, TrainConfig, method_identity, save_config
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.batches import BatchTransform, place_split
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS, SplitData, TaskSpec
from mtl_cog.errors import ConfigError, RunFolderError, UserError
from mtl_cog.evaluation.assess import AssessSettings
from mtl_cog.evaluation.groups import check_groups
from mtl_cog.evaluation.inference import predict_split
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.evaluation.shift import evaluate_shift
from mtl_cog.io import append_jsonl, atomic_write_json, read_jsonl
from mtl_cog.models.network import parameter_counts
from mtl_cog.models.two_stage import attach_second_stage_head
from mtl_cog.objectives import WithAuxiliaryLoss
from mtl_cog.reporting.end_of_run import assess_and_save, finish_run
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as state
from mtl_cog.runs.checkpoint import load_model, read_metadata, save_model
from mtl_cog.runs.metrics_log import append_line, epoch_line, wandb_row
from mtl_cog.runs.task_spec import save_task_spec
from mtl_cog.runs.tracking import Tracker, log_with
from mtl_cog.training import resume_settings
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.aggregated_step import Aggregation
from mtl_cog.training.calibrator_view import (
    CalibratorRecord,
    calibrator_record,
    flag_identity_calibrator,
    task_weights_line,
)
from mtl_cog.training.optim import learning_rates
from mtl_cog.training.preflight import check_registered_names
from mtl_cog.training.step import train_one_epoch
from mtl_cog.training.trainee import Trainee, build_trainee


@dataclass
class EpochEnd:
    """What a hook sees after each validated epoch (of stage one or stage two)."""

    stage: str  # "stage_one" | "stage_two"
    epoch: int
    train_loss: float
    val: dict[str, dict]  # score(...) of the validation split
    val_predictions: Predictions
    model: nn.Module  # the unwrapped network, in the state it was validated in
    improved: bool
    best_epoch: int
    is_main_process: bool  # print or write only where this is true


@dataclass
class Hooks:
    """What differs between callers of ``fit``; every hook runs on every process."""

    on_epoch_end: Callable[[EpochEnd], None] | None = None


@dataclass
class RunResult:
    run_dir: Path
    best_epoch: int
    metrics: dict[str, dict] = field(default_factory=dict)  # split -> score(...) of the best network


@dataclass
class Stage:
    """One stage's loop: its network, optimiser, files and selection rule."""

    name: str
    network: nn.Module  # prepared (what the steps run)
    model: nn.Module  # unwrapped (what is saved)
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    epochs: int
    seed: int
    selection_metric: str
    files: state.StageFiles
    patience: int | None = None  # stop after this many epochs without improvement; None = never
    aggregation: Aggregation | None = None  # mtl.aggregator (None: equal weights, plain training)

    @classmethod
    def stage_one(cls, trainee: Trainee, cfg: Config, files: state.StageFiles) -> Stage:
        """Stage one of ``cfg`` on ``build_trainee``'s network (``fit`` and the benchmarks that time it)."""
        return cls("stage_one", trainee.network, trainee.model, trainee.objective, trainee.optimizer,
                   trainee.scheduler, cfg.train.epochs, cfg.seed, cfg.eval.selection_metric, files,
                   aggregation=trainee.aggregation)


def is_better(metric: str, value: float, best: float | None) -> bool:
    if best is None or math.isnan(best):
        return not math.isnan(value)
    return value > best if metric == "accuracy" else value < best


def open_run_folder(cfg: Config, accelerator: Accelerator, resume_dir: Path | None, overwrite: bool,
                    held: ExitStack) -> Path:
    """The run folder: the one being resumed (locked now, into ``held``), or a new one's path (never
    silently over a previous run; created and locked by ``rundir.create_run_folder`` once the run starts)."""
    if resume_dir is not None:
        on_main_process(accelerator, lambda: held.enter_context(rundir.open_for_resume(resume_dir)))
        return resume_dir
    # One run name for all processes (timestamps differ between them).
    name = [cfg.run_name or rundir.default_run_name(cfg.data.task, method_identity(cfg.to_dict()), cfg.seed)]
    run_name = broadcast_object_list(name)[0] if accelerator.num_processes > 1 else name[0]
    run_dir = Path(cfg.output_dir) / run_name
    rundir.check_output_dir(Path(cfg.output_dir))
    rundir.check_new_run(run_dir, overwrite)  # on every process, so all stop together
    return run_dir


def on_main_process(accelerator: Accelerator, action: Callable[[], object]) -> None:
    """Run ``action`` on the main process only; a ``UserError`` there stops every process with its message."""
    error = None
    if accelerator.is_main_process:
        try:
            action()
        except UserError as err:
            error = err
    message = str(error) if error is not None else None
    if accelerator.num_processes > 1:
        message = broadcast_object_list([message])[0]
    if error is not None:
        raise error
    if message is not None:
        raise RunFolderError(message)


def fit(cfg: Config, *, resume_dir: Path | None = None, overwrite: bool = False,
        hooks: Hooks | None = None, saved_config: Config | None = None) -> RunResult:
    """Train, select, evaluate and save one run described by ``cfg``; see the module docstring.

    The run folder is locked (``mtl_cog.locks``) while ``fit`` writes into it, and unlocked
    however ``fit`` ends (a killed run leaves a stale lock, which the next ``--resume`` takes over).
    Every check that can refuse the run (names, the run folder, the settings changed on
    ``--resume``, the saved training state) runs before the first file is written. ``saved_config``
    is ``resume_dir``'s ``config.yaml`` when the caller has read it already.
    """
    with ExitStack() as held:
        return _fit(cfg, resume_dir, overwrite, hooks or Hooks(), held, saved_config)


def _fit(cfg: Config, resume_dir: Path | None, overwrite: bool, hooks: Hooks, held: ExitStack,
         saved_config: Config | None) -> RunResult:
    check_registered_names(cfg)  # a misspelt head or loss fails now, not after hours of stage one
    accelerator = create_accelerator(log_with(cfg.tracking), cfg.train.precision, cfg.train.dist_timeout_s)
    set_seed(cfg.seed)
    run_dir = open_run_folder(cfg, accelerator, resume_dir, overwrite, held)
    # refused changes (a key that cannot change, fewer epochs than already trained) stop here, unwritten
    plan = resume_settings.plan_resume(run_dir, cfg, saved_config) if resume_dir is not None else None
    accelerator.print(f"run folder: {run_dir}")

    with accelerator.main_process_first():  # the main process builds any data cache first
        task_data = load_task(cfg.data)
    spec, train, val, test = task_data.spec, *(task_data.splits[s] for s in ("train", "val", "test"))
    check_groups(cfg.eval.groups, spec.task_names)  # a misspelt group fails now, not after training
    if cfg.eval.groups and any(bool((s.labels == MISSING_LABEL).any()) for s in (val, test)):
        raise ConfigError("eval.groups: the subgroup metrics need every label of the validation and test splits; "
                          "this data set has missing labels there. Leave eval.groups empty.")
    train = place_split(train, accelerator.device) if cfg.train.images_on_device else train

    # partly labelled data (MISSING_LABEL): the losses look for missing labels; fully labelled: they never do
    trainee = build_trainee(accelerator, cfg, spec.layout, partial_labels=bool((train.labels == MISSING_LABEL).any()))
    counts = trainee.counts
    leader = "+".join(cfg.method.leader) or "none (standard training)"
    accelerator.print(f"method {cfg.method.name}: leader = {leader}; parameters {counts}")
    accelerator.print(
        f"data {spec.dataset}: {spec.num_tasks} task(s), train/val/test = {len(train)}/{len(val)}/{len(test)}"
    )
    if resume_dir is None:  # only now: bad data or a bad model name leave no half-made run folder
        on_main_process(accelerator, lambda: held.enter_context(rundir.create_run_folder(run_dir, overwrite)))
    model = trainee.model
    stage_one_best = run_dir / rundir.STAGE_ONE_MODEL
    two_stage_started = cfg.two_stage.enabled and stage_one_best.exists()
    stage_one = Stage.stage_one(trainee, cfg, state.StageFiles(
        run_dir / rundir.STATE, run_dir / rundir.METRICS,
        stage_one_best if two_stage_started else run_dir / rundir.BEST_MODEL))
    progress = restore_stage(accelerator, stage_one)  # a damaged state is refused here, before config.yaml changes
    if accelerator.is_main_process:
        save_config(cfg, run_dir / rundir.CONFIG)
        save_task_spec(spec, run_dir / rundir.TASK_SPEC)
        atomic_write_json(run_dir / rundir.PARAMS, {"counts": counts, "leader": cfg.method.leader})
    accelerator.wait_for_everyone()
    tracker = Tracker(accelerator, run_dir, cfg.wandb_project, run_dir.name, cfg.to_dict(), group=cfg.wandb_group,
                      job_type=cfg.wandb_job_type)
    if accelerator.is_main_process:
        replay_to_tracker(tracker, stage_one.files.metrics)
    if plan is not None:
        apply_resumed_settings(accelerator, plan, cfg, stage_one, progress, run_dir)
    best_epoch = run_stage(accelerator, stage_one, progress, spec, train, val, cfg.train, cfg.eval, tracker, hooks)

    accelerator.wait_for_everyone()
    if cfg.eval.score_last_epoch:  # the network in memory is the last epoch's: its predictions, for the last rule
        assess_and_save(accelerator, trainee.network, spec, {rundir.last_epoch_split(s): d for s, d in (("val", val),
                        ("test", test))}, cfg.train.eval_batch_size, AssessSettings.of_run(cfg), run_dir)
    # The best checkpoint (validation Brier by default), on every process.
    load_model(stage_one.files.best_model, model)
    calibrator_at_identity = flag_identity_calibrator(accelerator, model)
    selected = f"epoch {best_epoch}, by validation {cfg.eval.selection_metric}"
    prepared = trainee.network
    if cfg.two_stage.enabled:  # TST / V-TST: a new head on the frozen backbone, trained by the same loop
        prepared = run_second_stage(accelerator, cfg, model, trainee.objective, spec, train, val, run_dir, hooks)
        head_epoch = read_metadata(run_dir / rundir.BEST_MODEL).get("epoch")
        selected = f"stage one epoch {best_epoch}, stage-two head epoch {head_epoch} by validation nll"

    results = finish_run(accelerator, prepared, spec, val, test, cfg.train.eval_batch_size,
                         AssessSettings.of_run(cfg), run_dir, tracker, best_epoch, cfg.train.epochs + 1,
                         calibrator_at_identity, selected, shift_job(accelerator, prepared, cfg, spec, test))
    accelerator.print(f"run folder: {run_dir}")
    accelerator.print(str(run_dir))
    return RunResult(run_dir, best_epoch, results)


def shift_job(accelerator: Accelerator, network: nn.Module, cfg: Config, spec: TaskSpec, test: SplitData):
    """eval.shift: the test split under corruptions, scored from the assessed validation and test splits
    (post-hoc calibrators of eval.shift_posthoc fitted on the clean validation predictions); None when off."""
    if not cfg.eval.shift:
        return None

    def run(assessed) -> object:
        return evaluate_shift(accelerator, network, TASKS.get(cfg.data.task), spec, cfg.data, cfg.eval, test,
                              assessed["test"].predictions, assessed["val"].predictions, cfg.eval.shift,
                              cfg.eval.shift_severities, cfg.eval.shift_posthoc, cfg.train.eval_batch_size)
    return run


def restore_stage(accelerator: Accelerator, stage: Stage) -> state.Progress:
    """The stage's last saved state loaded into its model, optimiser and scheduler (fresh if none)."""
    return state.restore_run(stage.files, stage.model, stage.optimizer, stage.scheduler, accelerator.is_main_process,
                             objective=stage.objective)


def run_stage(accelerator: Accelerator, stage: Stage, progress: state.Progress, spec: TaskSpec, train: SplitData,
              val: SplitData, train_cfg: TrainConfig, eval_cfg: EvalConfig, tracker: Tracker | None,
              hooks: Hooks) -> int:
    """Train ``stage`` from ``progress`` (see ``restore_stage``) to its last epoch; return the best epoch.

    One epoch = train, validate, let adaptive parts see the validation predictions, log, keep the
    best checkpoint, save the resumable state. ``tracker`` receives stage one's epochs (stage two
    writes only its own metrics file).
    """
    best, best_epoch = progress.best, progress.best_epoch
    if progress.epoch > 1 or progress.within.step:
        accelerator.print(f"{stage.name}: resumed at epoch {progress.epoch}, step {progress.within.step} "
                          f"(best epoch {best_epoch})")
    transform = BatchTransform(spec, train=True, device=accelerator.device)

    def save_state(next_epoch: int, within: state.EpochProgress) -> None:
        if accelerator.is_main_process:
            lines = state.count_lines(stage.files.metrics)
            state.save_training_state(stage.files.state, stage.model, stage.optimizer, stage.scheduler,
                                      state.Progress(next_epoch, within, best, best_epoch, lines), stage.objective)

    for epoch in range(progress.epoch, stage.epochs + 1):
        started = time.perf_counter()
        lrs = learning_rates(stage.optimizer)
        stats = train_one_epoch(
            accelerator, stage.network, stage.objective, stage.optimizer, train, transform, train_cfg.batch_size,
            stage.seed, epoch, start=progress.within if epoch == progress.epoch else None,
            nonfinite=train_cfg.nonfinite, check_every=train_cfg.log_every_steps,
            save_every=train_cfg.save_every_steps, on_save=lambda within, epoch=epoch: save_state(epoch, within),
            aggregation=stage.aggregation,
        )
        predictions = predict_split(accelerator, stage.network, spec, val, train_cfg.eval_batch_size)
        val_metrics = score(predictions, eval_cfg.bins, eval_cfg.joint_pairs)
        improved = is_better(stage.selection_metric, val_metrics["mean"][stage.selection_metric], best)
        if improved:
            best, best_epoch = val_metrics["mean"][stage.selection_metric], epoch
        calibrator = calibrator_record(stage.model, spec) if stage.name == "stage_one" else None
        log_epoch(accelerator, stage, tracker, epoch, stats, lrs, val_metrics, best_epoch, calibrator)
        if accelerator.is_main_process:  # what produced the numbers, apart from them (they stay bit-exact on resume)
            append_jsonl(stage.files.metrics.with_name(rundir.TIMING), {
                "stage": stage.name, "epoch": epoch, "seconds": round(time.perf_counter() - started, 3),
                "threads": torch.get_num_threads(), "train_images": len(train), "processes": accelerator.num_processes})
        if hooks.on_epoch_end is not None:
            hooks.on_epoch_end(EpochEnd(stage.name, epoch, stats["loss"], val_metrics, predictions, stage.model,
                                        improved, best_epoch, accelerator.is_main_process))
        notify_validation_end(stage, predictions)  # before the save: an adapted part is saved with the state
        stage.scheduler.step()
        stopping = stage.patience is not None and epoch - best_epoch >= stage.patience
        # Order matters for resuming (mtl_cog/runs/training_state.py): metrics line, then state, then best model.
        save_state(stage.epochs + 1 if stopping else epoch + 1, state.EpochProgress())
        if improved and accelerator.is_main_process:
            save_model(stage.files.best_model, stage.model, metadata={"epoch": str(epoch)})
        if stopping:
            accelerator.print(f"{stage.name}: no better validation {stage.selection_metric} for "
                              f"{stage.patience} epochs, stopping.")
            break
    accelerator.wait_for_everyone()
    return best_epoch


def apply_resumed_settings(accelerator: Accelerator, plan: resume_settings.ResumePlan, cfg: Config, stage: Stage,
                           progress: state.Progress, run_dir: Path) -> None:
    """Apply the settings changed on ``--resume`` (checked by ``plan_resume``) to the restored optimiser; log them."""
    if not plan.changes:
        return
    resume_settings.apply_to_optimizer(cfg, plan.changes, stage.optimizer, stage.scheduler)
    if accelerator.is_main_process:
        resume_settings.record_resume(run_dir / rundir.RESUMES, progress.epoch, progress.within.step, plan.changes)
    accelerator.print("resumed with " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in plan.changes.items()))


def notify_validation_end(stage: Stage, predictions: Predictions) -> None:
    """Parts that adapt between epochs see the validation predictions (``on_validation_end(predictions)``).

    Any sub-module of the network or the objective may define the method (for example a layer
    whose scale is moved toward the value at which the network is calibrated); it runs on every
    process with the same gathered predictions, so all processes stay identical.
    """
    for root in (stage.model, stage.objective):
        for module in root.modules():
            hook = getattr(module, "on_validation_end", None)
            if callable(hook):
                hook(predictions)


def log_epoch(accelerator: Accelerator, stage: Stage, tracker: Tracker | None, epoch: int, stats: dict, lrs: dict,
              val_metrics: dict, best_epoch: int, calibrator: CalibratorRecord | None = None) -> None:
    """One line of the stage's metrics file (one schema for both stages, ``mtl_cog.runs.metrics_log``;
    stage one's also to W&B) and one console line (two with a calibrator)."""
    line = epoch_line(stage.name, epoch, stats["loss"], lrs, val_metrics, best_epoch, stats["skipped"],
                      None if calibrator is None else {"summary": calibrator.summary, "tasks": calibrator.by_task},
                      stats.get("task_weights"), stats.get("conflict_rate"))
    if tracker is not None:
        tracker.log_epoch(epoch, {k: v for k, v in line.items() if k != "epoch"}, wandb_row(line))
        prefix = f"epoch {epoch:3d}/{stage.epochs}"
    else:
        if accelerator.is_main_process:
            append_line(stage.files.metrics, line)
        prefix = f"stage two epoch {epoch:3d}/{stage.epochs}"
    mean = val_metrics["mean"]
    accelerator.print(
        f"{prefix}  loss {stats['loss']:.4f}  val acc {mean['accuracy']:.4f}  nll {mean['nll']:.4f}"
        f"  brier {mean['brier']:.4f}  ece@15 {mean['ece@15']:.4f}{'  *' if best_epoch == epoch else ''}"
    )
    if calibrator is not None:
        accelerator.print(f"           calibrator: {calibrator.one_line()}")
    if "task_weights" in stats:
        conflict = f"  conflict rate {stats['conflict_rate']:.2f}" if "conflict_rate" in stats else ""
        accelerator.print(f"           task weights: {task_weights_line(stats['task_weights'])}{conflict}")


def replay_to_tracker(tracker: Tracker, metrics_path: Path) -> None:
    """The epochs of ``metrics.jsonl`` (as repaired by ``restore_stage``) that W&B lacks, on ``--resume``."""
    if tracker.enabled:
        tracker.replay({line["epoch"]: wandb_row(line) for line in read_jsonl(metrics_path) if not line.get("final")})


def run_second_stage(accelerator: Accelerator, cfg: Config, network: nn.Module, objective: nn.Module,
                     spec: TaskSpec, train: SplitData, val: SplitData, run_dir: Path,
                     hooks: Hooks | None = None) -> nn.Module:
    """TST / V-TST: train a new head on ``network``'s frozen backbone; return the prepared best network.

    ``network`` is the unwrapped stage-one model with its best checkpoint loaded. It is kept as
    ``stage_one_model.safetensors``; the best two-stage network replaces ``best_model.safetensors``.
    """
    stage_one_path = run_dir / rundir.STAGE_ONE_MODEL
    if accelerator.is_main_process and not stage_one_path.exists():
        best_path = run_dir / rundir.BEST_MODEL
        save_model(stage_one_path, network, metadata=read_metadata(best_path) if best_path.exists() else None)
    accelerator.wait_for_everyone()
    two = cfg.two_stage
    model = attach_second_stage_head(network, two, spec.layout)
    counts = parameter_counts(model)
    accelerator.print(f"two-stage ({two.head} head, Z={two.latent_dim}): trainable parameters {counts}; Adam lr "
                      f"{two.lr:g}, {two.epochs} epochs, best validation NLL kept, "
                      + ("no early stopping" if two.patience is None else f"patience {two.patience}"))
    if accelerator.is_main_process:
        atomic_write_json(run_dir / rundir.STAGE_TWO_PARAMS, {"counts": counts, "trained": ["heads"]})
    optimizer = torch.optim.Adam([{"name": "heads", "params": list(model.heads.parameters())}], lr=two.lr,
                                 weight_decay=two.weight_decay)
    constant = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=1.0)  # stage two: a constant rate
    loss = WithAuxiliaryLoss(objective, model.heads, two.kl_weight)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    stage = Stage(
        "stage_two", prepared, model, loss, optimizer, constant, two.epochs,
        cfg.seed + 1,  # other shuffles than stage one's
        "nll",  # TST / V-TST select their head on validation NLL
        state.StageFiles(run_dir / rundir.STAGE_TWO_STATE, run_dir / rundir.STAGE_TWO_METRICS,
                         run_dir / rundir.BEST_MODEL),
        patience=two.patience,
    )
    run_stage(accelerator, stage, restore_stage(accelerator, stage), spec, train, val, cfg.train, cfg.eval, None,
              hooks or Hooks())
    load_model(stage.files.best_model, model)
    return prepared
