"""Batches from the uint8 image cache: index sharding across processes and batched augmentation.

The images of a split live in one uint8 tensor (N, 3, H, W), decoded once. A step gathers a
batch by index, moves it to the training device and augments it there as whole-batch tensor ops
(random pad+crop, horizontal flip, normalisation): no per-image Python, no worker processes.

Sharding: we shard indices ourselves instead of using a DataLoader, so evaluation carries each
sample's index and drops its own padding after gathering (docs/explanation/architecture.md): every sample is counted
exactly once and in data-set order, whatever the number of processes.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch

from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.errors import ConfigError


class BatchTransform:
    """uint8 (B, 3, H, W) on device -> normalised float, with train-time augmentation if enabled.

    Crop and flip are one fused gather (``crop_and_flip``); normalisation works in place on
    the float copy. Every op is whole-batch, so the cost per image does not depend on Python.
    """

    def __init__(self, spec: TaskSpec, train: bool, device: torch.device | str = "cpu") -> None:
        self.pad = spec.pad_crop if train else 0
        self.flip = spec.hflip and train
        self.mean = torch.tensor(spec.mean, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(spec.std, device=device).view(1, 3, 1, 1) * 255

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.pad or self.flip:
            images = crop_and_flip(images, self.pad, self.flip, generator)
        return images.float().sub_(self.mean).div_(self.std)  # in place on the new float copy


def crop_and_flip(
    images: torch.Tensor, pad: int, flip: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Random pad+crop (zero padding of ``pad`` pixels) and/or horizontal flip, per image.

    Each output row/column is an index into the (padded) input: a crop offsets the indices, a
    flip reverses the column indices. So the whole augmentation is at most two ``gather`` calls
    (rows, then columns) with broadcast (never materialised) index tensors; no per-image Python
    and no ``torch.where`` over a flipped copy of the batch.
    """
    b, c, h, w = images.shape
    device = images.device
    # Random numbers come from the CPU generator (reproducible on any device), then move.
    dy = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator)
    cols = dx + torch.arange(w)
    if flip:
        mirrored = torch.rand(b, 1, generator=generator) < 0.5
        cols = torch.where(mirrored, cols.flip(1), cols)
    cols = cols.to(device, non_blocking=True)
    if pad:
        images = torch.nn.functional.pad(images, (pad, pad, pad, pad))
        rows = (dy + torch.arange(h)).to(device, non_blocking=True)
        images = images.gather(2, rows.view(b, 1, h, 1).expand(b, c, h, w + 2 * pad))
    return images.gather(3, cols.view(b, 1, 1, w).expand(b, c, h, w))


def random_crop(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero-pad by ``pad`` and crop back to H x W at a random offset per image."""
    return crop_and_flip(images, pad, False, generator)


def place_split(split: SplitData, device: torch.device | str, max_fraction: float = 0.5) -> SplitData:
    """The split with images and labels on ``device`` if they fit, else unchanged (a warning).

    For ``train.images_on_device``: with the uint8 images in GPU memory a step gathers its batch
    there, with no host-to-device copy at all. "Fits" = at most ``max_fraction`` of the free
    device memory, so the model keeps room for activations. A CPU device changes nothing (the
    memory-mapped cache stays shared with other processes instead of being copied).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return split
    needed = split.images.numel() + split.labels.numel() * split.labels.element_size()
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if needed > max_fraction * free:
            warnings.warn(
                f"train.images_on_device: the training images need {needed / 2**30:.2f} GiB, more than "
                f"{max_fraction:.0%} of the {free / 2**30:.2f} GiB free on {device}; keeping them on the host.",
                stacklevel=2,
            )
            return split
    return SplitData(split.images.to(device), split.labels.to(device), split.true_probs)


def train_batch_indices(
    num_samples: int, global_batch: int, rank: int, world: int, seed: int, epoch: int
) -> Iterator[torch.Tensor]:
    """This process's share of each shuffled global batch.

    The permutation depends only on (seed, epoch), so every process agrees on it and a run is
    reproducible. It is padded by wrapping around (as ``DistributedSampler`` does) so that all
    processes take the same number of equal-sized steps.
    """
    if global_batch % world:
        raise ConfigError(f"train.batch_size ({global_batch}) must be divisible by the number of processes ({world}).")
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(num_samples, generator=generator)
    batch = min(global_batch, (num_samples // world) * world) or world
    steps = -(-num_samples // batch)
    perm = perm.repeat(-(-steps * batch // num_samples))[: steps * batch]
    for step in range(steps):
        yield perm[step * batch : (step + 1) * batch][rank::world]


def eval_batch_indices(num_samples: int, batch_size: int, rank: int, world: int) -> Iterator[torch.Tensor]:
    """Contiguous, equal-sized shards; the last index is repeated as padding (dropped after gather)."""
    per_rank = -(-num_samples // world)
    idx = torch.arange(per_rank * world).clamp_(max=num_samples - 1)[rank::world]
    for start in range(0, per_rank, batch_size):
        yield idx[start : start + batch_size]
