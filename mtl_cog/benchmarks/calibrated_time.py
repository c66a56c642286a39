"""Wall time to a calibrated 40-task model: COG-FC in one run vs standard training + calibration after it.

Every part runs through the library's own code, on the built-in ``synthetic`` data set (40
binary attributes) with the shipped method configs (``configs/methods/``):

- COG-FC and the baseline: stage one as ``fit`` runs it (``mtl_cog.training.loop.run_stage``:
  train, validate, keep the best checkpoint, save the resumable state, every epoch), then the
  best checkpoint loaded;
- post-hoc temperature scaling of the baseline: ``mtl_cog.evaluation.posthoc.calibrate("ts")``,
  one temperature per task fitted on the validation logits (L-BFGS) and applied to the test
  logits. The validation and test predictions it starts from are not timed: ``fit`` computes
  them for every method at the end of a run, so they cost COG the same;
- TST's second stage on the baseline's backbone: ``mtl_cog.training.loop.run_second_stage``
  with the shipped ``tst`` config (the registered ``mlp`` head of ``mtl_cog.models.heads``,
  Z = 64, early stopping on validation NLL), for as many epochs as stage one.

``calibrated_model_time_ratio`` = COG-FC / (baseline + post-hoc TS + TST second stage): one
practitioner who trains once and calibrates it both ways, stage one shared. The two single
comparisons are written too (COG-FC over baseline + post-hoc TS, over baseline + TST stage).
Below 1, COG reaches a calibrated model sooner. Run-folder reports (figures, tables) are
left out on both sides: they are the same for every method and do not grow with training.
On the CPU, each part's CPU seconds are written too (``calibrated_model_cpu_time_ratio``): with
``--threads 1`` they do not grow with other processes' load, unlike wall time on a shared machine.
One untimed training step and validation pass come first, so that the part timed first does not
pay the process's start-up alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from mtl_cog.benchmarks.common import NUM_TASKS, T, Workload, method_config, timed
from mtl_cog.config import Config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TaskData
from mtl_cog.evaluation.inference import predict_split
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.models.network import parameter_counts
from mtl_cog.objectives import build_objective
from mtl_cog.runs import rundir
from mtl_cog.runs.checkpoint import load_model
from mtl_cog.runs.tracking import Tracker
from mtl_cog.runs.training_state import StageFiles, count_lines
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.loop import Hooks, Stage, restore_stage, run_second_stage, run_stage
from mtl_cog.training.trainee import build_trainee


@dataclass(frozen=True)
class Clock:
    wall: float  # seconds
    cpu: float  # CPU seconds of this process (all its threads)


def clocked(device: torch.device, work: Callable[[], T]) -> tuple[Clock, T]:
    cpu = time.process_time()
    wall, result = timed(device, work)
    return Clock(wall, time.process_time() - cpu), result


@dataclass
class StageOne:
    """A finished stage one: the prepared network (what predicts), the unwrapped one, its objective."""

    prepared: torch.nn.Module
    model: torch.nn.Module
    objective: torch.nn.Module


def synthetic_overrides(train_images: int, val_images: int, epochs: int) -> list[str]:
    """The built-in 40-attribute data set at the benchmark's sizes; stage two as long as stage one."""
    return [
        "data.task=synthetic", f"data.synthetic.num_attributes={NUM_TASKS}",
        f"data.synthetic.train_size={train_images}", f"data.synthetic.val_size={val_images}",
        f"data.synthetic.test_size={val_images}", "data.use_cache=false",  # generated in memory, nothing written
        f"train.epochs={epochs}", f"two_stage.epochs={epochs}",
    ]


def train_stage_one(accelerator: Accelerator, cfg: Config, task_data: TaskData, run_dir: Path) -> StageOne:
    """Stage one as ``fit`` runs it for ``cfg``: build, the epoch loop (``run_stage``), load the best weights."""
    spec, train, val = task_data.spec, task_data.splits["train"], task_data.splits["val"]
    set_seed(cfg.seed)  # the same initial backbone for every method
    trainee = build_trainee(accelerator, cfg, spec.layout)
    run_dir.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(accelerator, run_dir, cfg.wandb_project, run_dir.name, cfg.to_dict())
    stage = Stage.stage_one(trainee, cfg, StageFiles.stage_one(run_dir))
    run_stage(accelerator, stage, restore_stage(accelerator, stage), spec, train, val, cfg.train, cfg.eval, tracker,
              Hooks())
    load_model(stage.files.best_model, trainee.model)
    return StageOne(trainee.network, trainee.model, trainee.objective)


def warm_up(accelerator: Accelerator, cfg: Config, task_data: TaskData) -> None:
    """One untimed training step and one validation pass, so that the part timed first does not pay the
    process's one-off start-up (thread pools, allocator, kernel selection) that every real run pays once."""
    spec, device = task_data.spec, accelerator.device
    trainee = build_trainee(accelerator, cfg, spec.layout, seed=cfg.seed)
    batch = task_data.splits["train"].head(cfg.train.batch_size)
    trainee.step(BatchTransform(spec, train=True, device=device)(batch.images.to(device)), batch.labels.to(device))
    predict_split(accelerator, trainee.network, spec, task_data.splits["val"], cfg.train.eval_batch_size)


def measure_calibrated_time(workload: Workload, methods_dir: Path, work: Path, train_images: int, val_images: int,
                            epochs: int) -> dict:
    """Seconds of each part and the three ratios; see the module docstring."""
    overrides = synthetic_overrides(train_images, val_images, epochs)
    configs = {m: method_config(methods_dir, m, workload, overrides) for m in ("cog_fc", "baseline", "tst")}
    accelerator = create_accelerator(None, workload.precision)
    device = accelerator.device
    task_data = load_task(configs["baseline"].data)
    spec, splits = task_data.spec, task_data.splits
    warm_up(accelerator, configs["baseline"], task_data)

    cog, _ = clocked(device, lambda: train_stage_one(accelerator, configs["cog_fc"], task_data, work / "cog_fc"))
    base, baseline = clocked(
        device, lambda: train_stage_one(accelerator, configs["baseline"], task_data, work / "baseline"))

    eval_batch = configs["baseline"].train.eval_batch_size
    val, test = (predict_split(accelerator, baseline.prepared, spec, splits[s], eval_batch) for s in ("val", "test"))
    posthoc, _ = clocked(device, lambda: calibrate("ts", val, test))

    tst = configs["tst"]
    tst_dir = work / "tst"
    tst_dir.mkdir(parents=True, exist_ok=True)
    tst_objective = build_objective(spec.layout, tst.method).to(device)
    tst_stage, tst_network = clocked(device, lambda: run_second_stage(
        accelerator, tst, baseline.model, tst_objective, spec, splits["train"], splits["val"], tst_dir))
    tst_model = accelerator.unwrap_model(tst_network)

    def ratio(clock: str) -> float:
        return getattr(cog, clock) / (getattr(base, clock) + getattr(posthoc, clock) + getattr(tst_stage, clock))

    on_cpu = device.type == "cpu"
    return {
        "calibrated_model_time_ratio": ratio("wall"),
        "cog_vs_posthoc_ts_time_ratio": cog.wall / (base.wall + posthoc.wall),
        "cog_vs_tst_time_ratio": cog.wall / (base.wall + tst_stage.wall),
        "cog_fc_seconds": cog.wall,
        "baseline_train_seconds": base.wall,
        "posthoc_ts_seconds": posthoc.wall,
        "tst_second_stage_seconds": tst_stage.wall,
        # CPU seconds of this process: on a shared CPU they do not grow with other processes' load (with
        # --threads 1, where no thread waits for another); on a GPU they say nothing, so they are left out.
        "calibrated_model_cpu_time_ratio": ratio("cpu") if on_cpu else None,
        "cpu_seconds": {"cog_fc": cog.cpu, "baseline": base.cpu, "posthoc_ts": posthoc.cpu,
                        "tst_second_stage": tst_stage.cpu} if on_cpu else None,
        "tst_second_stage": {
            "head": type(tst_model.heads).__name__,
            "registry_name": tst.two_stage.head,
            "latent_dim": tst.two_stage.latent_dim,
            "trainable_parameters": parameter_counts(tst_model),  # the new heads only
            "epochs_run": count_lines(tst_dir / rundir.STAGE_TWO_METRICS),
            "patience": tst.two_stage.patience,
        },
        "setup": {**dataclasses.asdict(workload), "data": "synthetic", "tasks": NUM_TASKS,
                  "train_images": train_images, "val_images": val_images, "test_images": val_images,
                  "epochs": epochs, "validation": "every epoch (as fit)", "device": str(device)},
    }
