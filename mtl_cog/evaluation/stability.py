"""Stability scaling: post-hoc calibration by how stable each prediction is under input perturbations.

The image counterpart of CaliDist (an LLM method that rescales confidence by how much a
prediction changes when distractors are added to the prompt). Here, per sample and task:

1. *Stability* s in [0, 1]: the clean image and K perturbed copies go through the trained network;
   s = 1 - mean_k TV(p_clean, p_k), with TV the total-variation distance between the class
   distributions (a binary task: |p - p_k|). s = 1 iff no perturbation moves the prediction at all
   (a network that ignores its input is perfectly stable); a prediction that flips gets s near 0.
2. *Rescaling*: a temperature per sample and task that grows with instability,
   T = exp(a_t + b_t (1 - s)), applied to the run's saved logits, z / T. (a_t, b_t) are fitted per
   task on the validation split by L-BFGS on the NLL (the same ``fit_calibrator`` as post-hoc TS);
   b_t = 0 is temperature scaling, so the fit can only do as well as TS or better on validation.

Perturbations (on the uint8 images, then the run's evaluation preprocessing), cycled over k:
horizontal flip, a random translation (zero padding by H/8 and a random crop back), Gaussian
pixel noise (sigma 8 of 255), and a grey square occluding a quarter of the side at a random place.
They are drawn from a generator seeded by (seed, k, batch start), so a result does not depend on
the batch size or the device. Our choices (CaliDist's distractor prompts have no image analogue):
mild, label-preserving changes, so that instability means the model's evidence is fragile.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.batches import crop_and_flip
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.predictions import Predictions, flat_tensors, layout_of, require_labelled, select_rows
from mtl_cog.models.calibrators import fit_calibrator

PERTURBATIONS = ("hflip", "shift", "noise", "occlusion")


def perturb(images: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """One label-preserving perturbation of a uint8 batch (B, 3, H, W) -> uint8 batch."""
    b, _, h, w = images.shape
    if kind == "hflip":
        return images.flip(3)
    if kind == "shift":
        return crop_and_flip(images, max(1, h // 8), False, generator)
    if kind == "noise":
        noise = torch.randn(images.shape, generator=generator).to(images.device) * 8.0
        return (images.float() + noise).round().clamp(0, 255).to(torch.uint8)
    if kind == "occlusion":
        side = max(1, h // 4)
        top = torch.randint(0, h - side + 1, (b,), generator=generator)
        left = torch.randint(0, w - side + 1, (b,), generator=generator)
        rows, cols = torch.arange(h), torch.arange(w)
        inside = (((rows[None, :] >= top[:, None]) & (rows[None, :] < top[:, None] + side))[:, :, None]
                  & ((cols[None, :] >= left[:, None]) & (cols[None, :] < left[:, None] + side))[:, None, :])
        return images.masked_fill(inside[:, None].to(images.device), 128)
    raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(PERTURBATIONS)}")


def class_probabilities(logits: torch.Tensor, layout: LogitLayout) -> list[torch.Tensor]:
    """Flat logits (B, L) -> per task (B, K_t) class probabilities (a binary task: [1 - p, p])."""
    out = []
    for block in layout.split(logits):
        if block.dim() == 1:
            p = torch.sigmoid(block)
            out.append(torch.stack([1 - p, p], dim=1))
        else:
            out.append(block.softmax(dim=1))
    return out


@torch.no_grad()
def stability(network: nn.Module, transform, images: torch.Tensor, layout: LogitLayout, perturbations: int = 8,
              seed: int = 0, batch_size: int = 256) -> np.ndarray:
    """(N, T) stability in [0, 1] of ``network``'s predictions on uint8 ``images`` (see the module doc)."""
    if perturbations < 1:
        raise PosthocError(f"stability scaling needs at least one perturbation, got {perturbations}.")
    network.eval()
    device = next(network.parameters()).device
    out = []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size].to(device)
        clean = class_probabilities(network(transform(batch)).double(), layout)
        change = torch.zeros(len(batch), layout.num_tasks, dtype=torch.float64, device=device)
        for k in range(perturbations):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + k * 7919 + start)
            moved = perturb(batch, PERTURBATIONS[k % len(PERTURBATIONS)], generator)
            probs = class_probabilities(network(transform(moved)).double(), layout)
            for t, (p, q) in enumerate(zip(clean, probs)):
                change[:, t] += 0.5 * (p - q).abs().sum(dim=1)  # total variation distance
        out.append((1 - change / perturbations).clamp(0, 1).cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, layout.num_tasks))


class StabilityTemperature(nn.Module):
    """z / T with T = exp(a_t + b_t * (1 - s)) per sample and task; ``instability`` (N, T) is set before use."""

    def __init__(self, layout: LogitLayout) -> None:
        super().__init__()
        self.log_base = nn.Parameter(torch.zeros(layout.num_tasks))  # a_t
        self.slope = nn.Parameter(torch.zeros(layout.num_tasks))  # b_t
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)
        self.instability: torch.Tensor | None = None

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if self.instability is None or self.instability.shape != (len(logits), len(self.log_base)):
            raise PosthocError("stability scaling: set the (N, T) instability of these logits first.")
        log_t = self.log_base + self.slope * self.instability  # (N, T)
        return logits * torch.exp(-log_t)[:, self.column_task]


def check_images(name: str, images: torch.Tensor, predictions: Predictions) -> None:
    if len(images) != len(predictions):
        raise PosthocError(f"stability scaling: the {name} split has {len(images)} images but its prediction "
                           f"file {len(predictions)} samples; was the data set changed since the run?")


def fit_stability(network: nn.Module, transform, val_images: torch.Tensor, val: Predictions, perturbations: int = 8,
                  seed: int = 0) -> StabilityTemperature:
    """(a_t, b_t) per task fitted on ``val`` (its images in the predictions' order) by ``fit_calibrator``.

    Partly labelled data (labels ``MISSING_LABEL``): task t's (a_t, b_t) see only the rows labelled
    for t (``task_nll`` leaves the others out, and no parameter is shared between tasks, so this is
    the fit on t's labelled subset); a task with no labelled row is refused, as by every post-hoc
    method; and only the samples labelled in some task are re-run through the network, since an
    image labelled in no task adds nothing to any task's fit. (Dropping those rows moves the later
    rows' batch start, hence their random perturbations: the same fit in law, not bit for bit.)
    """
    check_images("validation", val_images, val)
    if len(val) == 0:
        raise PosthocError("stability scaling: the validation predictions are empty; nothing to fit on.")
    require_labelled(val.task_names, val.labels, "stability scaling: the validation predictions' ", PosthocError)
    anywhere = np.logical_or.reduce([np.asarray(y) != MISSING_LABEL for y in val.labels])
    if not anywhere.all():
        val, val_images = select_rows(val, anywhere), val_images[torch.from_numpy(anywhere)]
    layout = layout_of(val)
    calibrator = StabilityTemperature(layout).double()
    val_logits, val_labels = flat_tensors(val, layout)
    calibrator.instability = torch.as_tensor(1 - stability(network, transform, val_images, layout, perturbations,
                                                            seed), dtype=torch.float64)
    fit_calibrator(calibrator, val_logits, val_labels, layout, task_names=val.task_names,
                   what="post-hoc stability scaling")
    return calibrator


def apply_stability(calibrator: StabilityTemperature, network: nn.Module, transform, images: torch.Tensor,
                    predictions: Predictions, perturbations: int = 8, seed: int = 1) -> Predictions:
    """``predictions`` rescaled by a fitted ``calibrator``; ``seed`` differs from the fit's (other perturbations).
    Every row is rescaled, labelled or not (prediction files keep every row); scoring reads the labelled ones."""
    layout = layout_of(predictions)
    calibrator.instability = torch.as_tensor(1 - stability(network, transform, images, layout, perturbations, seed),
                                             dtype=torch.float64)
    with torch.no_grad():
        logits = calibrator(flat_tensors(predictions, layout)[0]).float().numpy()
    if not np.all(np.isfinite(logits)):
        raise PosthocError("stability scaling produced non-finite logits (the fit diverged on validation).")
    return Predictions(list(predictions.task_names), layout.split(logits), list(predictions.labels),
                       predictions.true_probs)


def stability_calibrate(network: nn.Module, transform, val_images: torch.Tensor, test_images: torch.Tensor,
                        val: Predictions, test: Predictions, perturbations: int = 8, seed: int = 0) -> Predictions:
    """``test`` with logits rescaled by stability scaling fitted on ``val`` (images in the predictions' order)."""
    check_images("validation", val_images, val)
    check_images("test", test_images, test)
    calibrator = fit_stability(network, transform, val_images, val, perturbations, seed)
    return apply_stability(calibrator, network, transform, test_images, test, perturbations, seed + 1)
