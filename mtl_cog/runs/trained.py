"""A finished run as a Python object: ``load_run(run_dir).predict_proba(images)``.

    from mtl_cog import load_run
    run = load_run("runs/synthetic-cog_fc-seed0-...")   # config + best (or stage-two) network
    probs = run.predict_proba(images)                    # {task: (N,) or (N, K)}, calibrator applied
    run.calibrator_parameters()                          # e.g. {"temperature": {task: T}}
    run.export("model.pt2")                              # one file: torch.export.load(...).module()(images)

Needs neither the data set nor an ``Accelerator``: the run folder holds the config, the task
spec (``task_spec.json``: task names, classes, normalisation) and the weights. Images are
preprocessed exactly as in evaluation (``BatchTransform(train=False)``): uint8 N x 3 x S x S
arrays or tensors at the run's ``data.image_size`` S, or PIL images, which are first brought to
S x S like the data sets' readers do (RGB, shorter side to S, centre crop; see
``mtl_cog.data.images``). Runs trained before ``task_spec.json`` existed fall back to reading
the spec from the data set under ``data.root``.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy.special import expit, softmax
from torch import nn

from mtl_cog import cog
from mtl_cog.config import Config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.images import resize_center_crop
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TaskSpec
from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.evaluation.inference import check_finite_logits
from mtl_cog.models.network import build_network
from mtl_cog.models.two_stage import attach_second_stage_head
from mtl_cog.runs import rundir
from mtl_cog.runs.checkpoint import load_model
from mtl_cog.runs.finished import check_finished_run
from mtl_cog.runs.task_spec import load_task_spec

ImageBatch = np.ndarray | torch.Tensor | Image.Image | Sequence[Image.Image]


def load_network(cfg: Config, spec: TaskSpec, run_dir: Path) -> torch.nn.Module:
    """The run's best network (for two-stage methods: with its second-stage head), on the CPU, eval mode.

    Built with ``pretrained=False``: the checkpoint holds every weight, so a run that started from
    pretrained weights opens offline without fetching them again.
    """
    network = build_network(dataclasses.replace(cfg.model, pretrained=False), cfg.method, spec.layout)
    if cfg.two_stage.enabled:  # TST / V-TST: the checkpoint holds the second-stage head
        network = attach_second_stage_head(network, cfg.two_stage, spec.layout)
    load_model(run_dir / rundir.BEST_MODEL, network)
    return network.eval()


def run_task_spec(cfg: Config, run_dir: Path) -> TaskSpec:
    path = run_dir / rundir.TASK_SPEC
    return load_task_spec(path) if path.exists() else load_task(cfg.data).spec


def check_same_spec(saved: TaskSpec, current: TaskSpec, run_dir: Path) -> None:
    """Refuse to re-evaluate a run on data whose spec (tasks, classes, normalisation) differs from its own."""
    if saved != current:
        raise RunFolderError(
            f"{run_dir}: the data set under data.root no longer matches the run's {rundir.TASK_SPEC} (saved "
            f"{saved.task_names[:3]}..., classes {saved.num_classes[:3]}..., mean {saved.mean}, std {saved.std}; now "
            f"{current.task_names[:3]}..., {current.num_classes[:3]}..., {current.mean}, {current.std}). Its network "
            "was trained on the saved spec; point data.root at that data set."
        )


class NormalisedImages(nn.Module):
    """uint8 (N, 3, S, S) -> normalised float32, the same operations as ``BatchTransform(train=False)``."""

    def __init__(self, transform: BatchTransform) -> None:
        super().__init__()
        self.register_buffer("mean", transform.mean.clone())
        self.register_buffer("std", transform.std.clone())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() - self.mean) / self.std


class TrainedRun:
    """A finished run's config, task spec and best network, ready to predict."""

    def __init__(self, run_dir: Path, config: Config, spec: TaskSpec, network: torch.nn.Module,
                 device: torch.device) -> None:
        self.run_dir, self.config, self.spec, self.device = run_dir, config, spec, device
        self.network = network.to(device)
        self.transform = BatchTransform(spec, train=False, device=device)

    @property
    def task_names(self) -> list[str]:
        return list(self.spec.task_names)

    def as_uint8_batch(self, images: ImageBatch) -> torch.Tensor:
        """``images`` -> uint8 (N, 3, S, S) on the CPU, or a ``UserError`` saying what is expected."""
        size = self.config.data.image_size
        if isinstance(images, Image.Image):
            images = [images]
        if isinstance(images, (list, tuple)):
            if not all(isinstance(img, Image.Image) for img in images):
                raise UserError("predict_proba takes PIL images, or one uint8 array/tensor of shape (N, 3, S, S).")
            arrays = [resize_center_crop(img, size) for img in images]
            images = np.stack(arrays).transpose(0, 3, 1, 2) if arrays else np.zeros((0, 3, size, size), np.uint8)
        # a view such as imgs[:, ::-1] has negative strides, which torch cannot wrap: copy it once
        batch = torch.as_tensor(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
        if not isinstance(batch, torch.Tensor) or batch.dtype != torch.uint8 or batch.dim() != 4 \
                or tuple(batch.shape[1:]) != (3, size, size):
            shape = tuple(batch.shape) if hasattr(batch, "shape") else type(batch).__name__
            dtype = getattr(batch, "dtype", "?")
            raise UserError(
                f"predict_proba needs uint8 images of shape (N, 3, {size}, {size}) (this run's data.image_size) "
                f"or PIL images; got {dtype} {shape}. Resize with mtl_cog.data.images.resize_center_crop."
            )
        return batch.cpu()

    @torch.no_grad()
    def predict_logits(self, images: ImageBatch, batch_size: int | None = None) -> np.ndarray:
        """Flat calibrated logits (N, L) in float32, as ``predictions_*.npz`` stores them per task."""
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral)
                                       or batch_size < 1):
            raise UserError(f"predict_proba: batch_size must be a whole number >= 1 (or None for the run's "
                            f"train.eval_batch_size); got {batch_size!r}.")
        batch = self.as_uint8_batch(images)
        step = int(batch_size or self.config.train.eval_batch_size)
        outputs = [self.network(self.transform(batch[i:i + step].to(self.device))).float().cpu()
                   for i in range(0, len(batch), step)]
        logits = torch.cat(outputs).numpy() if outputs else np.zeros((0, self.spec.layout.total), np.float32)
        check_finite_logits(logits, f"the network of {self.run_dir}")
        return logits

    def predict_proba(self, images: ImageBatch, batch_size: int | None = None) -> dict[str, np.ndarray]:
        """{task: P(y=1) of shape (N,) for a binary task, or (N, K) class probabilities}, calibrator applied."""
        per_task = self.spec.layout.split(self.predict_logits(images, batch_size).astype(np.float64))
        return {name: expit(z) if z.ndim == 1 else softmax(z, axis=1)
                for name, z in zip(self.task_names, per_task)}

    def export(self, path: str | Path) -> Path:
        """The run's network as one ``torch.export`` file (``mtl_cog.cog.export``) that plain torch loads:
        ``torch.export.load(path).module()(images)`` takes uint8 (N, 3, S, S) images (S: ``data.image_size``)
        and returns ``predict_proba``'s {task: probabilities}, normalisation and calibrator inside.

        ``torch.export`` rather than TorchScript (which torch now warns is deprecated) or safetensors plus a loader
        (which would need this package or timm to rebuild the network): the file is the graph and its weights,
        runs without mtl_cog or timm, and unpickles no code. PIL images are not taken: resize them first.
        """
        size = self.config.data.image_size
        pipeline = nn.Sequential(NormalisedImages(self.transform), self.network)
        example = torch.zeros((2, 3, size, size), dtype=torch.uint8, device=self.device)
        return cog.export(cog.Probabilities(pipeline, self.spec.layout, self.task_names), path, example)

    def calibrator_parameters(self) -> dict[str, dict[str, object]]:
        """The learned calibrator per task, e.g. {"temperature": {task: T}}; {} for the identity."""
        return self.network.calibrator.by_task(self.task_names)


# What predicting with a run's network reads besides the config and the task spec (which
# ``check_finished_run`` always checks): checked against the run's digests first.
NETWORK_FILES = (rundir.BEST_MODEL,)


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> TrainedRun:
    """Open a finished run folder (``DONE`` present) for prediction on ``device``."""
    run_dir = Path(run_dir)
    cfg = check_finished_run(run_dir, NETWORK_FILES)
    spec = run_task_spec(cfg, run_dir)
    return TrainedRun(run_dir, cfg, spec, load_network(cfg, spec, run_dir), torch.device(device))
