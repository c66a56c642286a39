"""Batches from the uint8 image cache: index sharding across processes and batched augmentation.

The images of a split live in one uint8 tensor (N, 3, H, W), decoded once. A step gathers a
batch by index, moves it to the training device and augments it there as whole-batch tensor ops
(random pad+crop, horizontal flip, normalisation): no per-image Python, no worker processes.

Sharding: we shard indices ourselves instead of using a DataLoader, so evaluation carries each
sample's index and drops its own padding after gathering (DESIGN.md §8): every sample is counted
exactly once and in data-set order, whatever the number of processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from mtl_cog.config import ConfigError
from mtl_cog.task_api import TaskSpec


class BatchTransform:
    """uint8 (B, 3, H, W) on device -> normalised float, with train-time augmentation if enabled."""

    def __init__(self, spec: TaskSpec, train: bool, device: torch.device | str = "cpu") -> None:
        self.pad = spec.pad_crop if train else 0
        self.flip = spec.hflip and train
        self.mean = torch.tensor(spec.mean, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(spec.std, device=device).view(1, 3, 1, 1) * 255

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.pad:
            images = random_crop(images, self.pad, generator)
        if self.flip:
            images = random_hflip(images, generator)
        return (images.float() - self.mean) / self.std


def random_crop(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero-pad by ``pad`` and crop back to H x W at a random offset per image (one gather)."""
    b, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator).to(images.device)
    dx = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator).to(images.device)
    rows = (dy + torch.arange(h, device=images.device)).view(b, 1, h, 1)
    cols = (dx + torch.arange(w, device=images.device)).view(b, 1, 1, w)
    batch = torch.arange(b, device=images.device).view(b, 1, 1, 1)
    channel = torch.arange(c, device=images.device).view(1, c, 1, 1)
    return padded[batch, channel, rows, cols]


def random_hflip(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    flip = (torch.rand(images.shape[0], generator=generator) < 0.5).to(images.device)
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)


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
