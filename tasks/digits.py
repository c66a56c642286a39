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

from mtl_cog.data.task_api import TASKS, SplitData, TaskData, TaskSpec, capped_sizes
from tasks.cifar import resize_square

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

    def source_files(self, data_cfg) -> list[Path]:
        # The bundled CSV, so a cache notices a scikit-learn upgrade that changes it.
        import sklearn.datasets

        path = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
        return [path] if path.exists() else []

    def load(self, data_cfg) -> TaskData:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels = np.asarray(bunch.images, dtype=np.float64)  # (N, 8, 8), values 0..16
        small = torch.from_numpy(np.round(pixels * (255.0 / 16.0)).astype(np.uint8))
        images = resize_square(small[:, None], data_cfg.image_size).expand(-1, 3, -1, -1).contiguous()
        labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64)).reshape(-1, 1)

        index = split_indices(len(images))
        # Grey images: one mean/std for all three channels, from the full training split
        # (before max_samples, so a capped run normalises exactly like a full one).
        train = images[torch.from_numpy(index["train"])].float() / 255.0
        mean, std = float(train.mean()), float(train.std())

        splits = {}
        for split, idx in index.items():
            idx_t = torch.from_numpy(idx[: data_cfg.max_samples])
            splits[split] = SplitData(images=images[idx_t], labels=labels[idx_t])

        spec = TaskSpec(
            dataset="digits",
            task_names=("digit",),
            num_classes=(10,),
            mean=(mean,) * 3,
            std=(std,) * 3,
            pad_crop=data_cfg.image_size // 8,  # one original pixel of shift
            hflip=False,  # a mirrored digit is not the same digit
        )
        return TaskData(spec=spec, splits=splits)


TASKS.register("digits")(DigitsTask())
