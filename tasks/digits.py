"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images), one task ``digit``.

It ships inside scikit-learn, so it works offline and loads in milliseconds: a real (not
generated) multi-class data set for quick runs and tests. Pixels (0..16) are scaled to 0..255,
upsampled bilinearly to ``data.image_size`` and copied to three channels. Splits are a fixed
60/20/20 permutation (``numpy.random.default_rng(0)``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mtl_cog.data.task_api import TASKS, SplitSource, TaskSource, TaskSpec, capped_sizes
from tasks.cifar import array_blocks, resize_square

SEED = 0
FRACTIONS = (0.6, 0.2)  # train, val; the rest is test


def split_indices(n: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """Fixed random train/val/test indices, each sorted to keep file order."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(FRACTIONS[0] * n), int(FRACTIONS[1] * n)
    parts = {"train": perm[:n_train], "val": perm[n_train : n_train + n_val], "test": perm[n_train + n_val :]}
    return {k: np.sort(v) for k, v in parts.items()}


N_IMAGES = 1797  # scikit-learn's bundled set


class DigitsTask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        return capped_sizes({k: len(v) for k, v in split_indices(N_IMAGES).items()}, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return 1

    def source_files(self, data_cfg) -> list[Path]:
        # The bundled CSV, so a cache notices a scikit-learn upgrade that changes it.
        import sklearn.datasets

        path = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
        return [path] if path.exists() else []

    def open(self, data_cfg) -> TaskSource:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels = np.asarray(bunch.images, dtype=np.float64)  # (N, 8, 8), values 0..16
        small = torch.from_numpy(np.round(pixels * (255.0 / 16.0)).astype(np.uint8))
        # 1,797 images: decoded whole here (tiny at any image size), handed out in blocks
        images = resize_square(small[:, None], data_cfg.image_size).expand(-1, 3, -1, -1).contiguous().numpy()
        labels = np.asarray(bunch.target, dtype=np.int64).reshape(-1, 1)

        index = split_indices(len(images))
        # Grey images: one mean/std for all three channels, from the full training split
        # (the same for every data.max_samples, which only takes a prefix of each split).
        train = torch.from_numpy(images[index["train"]]).float() / 255.0
        mean, std = float(train.mean()), float(train.std())

        splits = {split: SplitSource(labels=labels[idx], read_blocks=array_blocks(images[idx], data_cfg.image_size))
                  for split, idx in index.items()}

        spec = TaskSpec(
            dataset="digits",
            task_names=("digit",),
            num_classes=(10,),
            mean=(mean,) * 3,
            std=(std,) * 3,
            pad_crop=data_cfg.image_size // 8,  # one original pixel of shift
            hflip=False,  # a mirrored digit is not the same digit
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("digits")(DigitsTask())
