"""Images/s of the cached data pipeline over the usual torchvision + PIL ``DataLoader``.

Both read the same CelebA-format JPEG folder (official layout, written here): the usual
pipeline decodes every JPEG per sample in 2 worker processes and augments with torchvision;
ours decodes once into the memory-mapped uint8 cache (``load_task`` builds it) and then gathers
shuffled index batches and crops, flips and normalises whole batches. Both apply the same
augmentation (pad + random crop, horizontal flip, normalisation). Target: >= 30x.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from mtl_cog.config import DataConfig
from mtl_cog.data.batches import BatchTransform, train_batch_indices
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.errors import ConfigError
from tasks.celeba import MEAN, STD, read_attributes
from tasks.fixtures import CELEBA_ATTRIBUTES

LOADER_SPEEDUP_TARGET = 30.0
TORCHVISION_WORKERS = 2
MIN_JPEG_IMAGES = 10  # the 80/10/10 partition needs at least one validation and one test image


def write_celeba_folder(root: Path, n: int, seed: int = 0) -> Path:
    """``<root>/celeba`` in the official layout with ``n`` 178x218 JPEGs.

    Like ``tasks.fixtures.write_celeba``, but the pictures are smooth colour fields with mild
    noise, so that the JPEGs have the size (~8.7 KiB; real ones average ~8.5) and decode cost of
    real faces rather than of white noise (which would flatter the cached pipeline).
    """
    if n < MIN_JPEG_IMAGES:
        raise ConfigError(f"--jpeg-images must be >= {MIN_JPEG_IMAGES} (80/10/10 partition). Got {n}.")
    rng = np.random.default_rng(seed)
    folder = root / "celeba"
    (folder / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(1, n + 1)]
    for name in names:
        coarse = torch.from_numpy(rng.uniform(0, 255, (1, 3, 6, 5)).astype(np.float32))
        smooth = torch.nn.functional.interpolate(coarse, size=(218, 178), mode="bicubic", align_corners=False)[0]
        pixels = (smooth + torch.from_numpy(rng.normal(0, 4, smooth.shape).astype(np.float32))).clamp(0, 255)
        Image.fromarray(pixels.permute(1, 2, 0).to(torch.uint8).numpy()).save(folder / "img_align_celeba" / name,
                                                                               quality=90)
    values = rng.choice(np.array([-1, 1]), size=(n, len(CELEBA_ATTRIBUTES)))
    lines = [str(n), " ".join(CELEBA_ATTRIBUTES)] + [name + "".join(f" {v:2d}" for v in row)
                                                     for name, row in zip(names, values)]
    (folder / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    # contiguous blocks as in the official file: 80 % train, 10 % val, 10 % test
    codes = np.repeat([0, 1, 2], [n - 2 * (n // 10), n // 10, n // 10])
    (folder / "list_eval_partition.txt").write_text("".join(f"{nm} {c}\n" for nm, c in zip(names, codes)))
    return folder


class JpegFolder(torch.utils.data.Dataset):
    """The usual per-image pipeline: PIL decode, torchvision transforms, one sample at a time."""

    def __init__(self, folder: Path, names: list[str], labels: np.ndarray, transform) -> None:
        self.folder, self.names, self.labels, self.transform = folder, names, labels, transform

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int):
        with Image.open(self.folder / "img_align_celeba" / self.names[i]) as img:
            return self.transform(img.convert("RGB")), self.labels[i]


def torchvision_loader_rate(folder: Path, names: list[str], size: int, pad: int, batch: int, epochs: int) -> float:
    """Images/s of the usual pipeline over ``epochs`` epochs, after one untimed epoch that starts the workers."""
    _, _, labels = read_attributes(folder / "list_attr_celeba.txt")
    transform = transforms.Compose([
        transforms.Resize(size), transforms.CenterCrop(size), transforms.RandomCrop(size, padding=pad),
        transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize(MEAN, STD),
    ])
    loader = torch.utils.data.DataLoader(JpegFolder(folder, names, labels, transform), batch_size=batch,
                                         shuffle=True, num_workers=TORCHVISION_WORKERS, persistent_workers=True)
    for _ in loader:  # the first epoch starts the workers: not counted (generous to the baseline)
        pass
    start, count = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            count += len(images)
    return count / (time.perf_counter() - start)


def cached_pipeline_rate(split: SplitData, spec: TaskSpec, batch: int, min_seconds: float) -> float:
    """Images/s of the cached path as training uses it: shuffled index batches -> gather -> augment."""
    transform = BatchTransform(spec, train=True)
    generator = torch.Generator().manual_seed(0)
    start, count, epoch = time.perf_counter(), 0, 0
    while time.perf_counter() - start < min_seconds:
        epoch += 1
        for idx in train_batch_indices(len(split), batch, 0, 1, seed=0, epoch=epoch):
            images = transform(split.images[idx], generator)
            _labels = split.labels[idx]
            count += len(images)
    return count / (time.perf_counter() - start)


def measure_loader(work: Path, jpeg_images: int, image_size: int, batch_size: int, torchvision_epochs: int,
                   cached_seconds: float) -> dict:
    """Write the JPEG folder, build its cache through ``load_task``, time both pipelines on its train split."""
    start = time.perf_counter()
    folder = write_celeba_folder(work, jpeg_images)
    written = time.perf_counter() - start
    data_cfg = DataConfig(task="celeba", root=str(work), image_size=image_size, cache_dir=str(work / "cache"))
    start = time.perf_counter()
    task_data = load_task(data_cfg)  # decodes once and writes the cache
    build_seconds = time.perf_counter() - start
    pad = image_size // 8
    spec = dataclasses.replace(task_data.spec, pad_crop=pad)  # crop + flip: the heaviest augmentation we offer
    names = [p.split()[0] for p in (folder / "list_eval_partition.txt").read_text().splitlines() if p.endswith(" 0")]
    tv_rate = torchvision_loader_rate(folder, names, image_size, pad, batch_size, torchvision_epochs)
    cached_rate = cached_pipeline_rate(task_data.splits["train"], spec, batch_size, min_seconds=cached_seconds)
    jpeg_kib = sum(f.stat().st_size for f in (folder / "img_align_celeba").iterdir()) / jpeg_images / 1024
    return {
        "loader_speedup": cached_rate / tv_rate,
        "loader_speedup_target": LOADER_SPEEDUP_TARGET,
        "cached_images_per_s": cached_rate,
        "torchvision_images_per_s": tv_rate,
        "jpeg_folder": {"images": jpeg_images, "train_images": len(names), "mean_jpeg_kib": jpeg_kib,
                        "write_seconds": written},
        "cache_build_seconds": build_seconds,
        "augmentation": f"pad {pad} + random crop {image_size}, horizontal flip, normalise",
        "torchvision_workers": TORCHVISION_WORKERS,
    }
