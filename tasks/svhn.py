"""``svhn``: Street View House Numbers (cropped digits), one 10-class task ``digit``.

Files: ``train_32x32.mat`` and ``test_32x32.mat`` (MATLAB v5, read with ``scipy.io.loadmat``),
looked up in ``<data.root>/svhn/`` first and then in ``<data.root>/`` itself, where
``torchvision.datasets.SVHN`` puts them. Each holds ``X`` (32 x 32 x 3 x N uint8) and ``y``
(N x 1, labels 1..10 where 10 stands for the digit 0; we map it to 0 so the label is the digit).

20 % of the official training set (fixed permutation, ``default_rng(0)``) is the validation split;
the ``extra`` set is not used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io

from mtl_cog.data.task_api import TASKS, SplitSource, TaskSource, TaskSpec, capped_sizes
from mtl_cog.errors import DataError
from tasks.cifar import array_blocks, carve_validation

FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}
VAL_FRACTION = 0.2
MEAN = (0.4377, 0.4438, 0.4728)  # per-channel statistics of the SVHN training images
STD = (0.1980, 0.2010, 0.1970)

HOW_TO_GET = (
    "Get SVHN format 2 (train_32x32.mat, test_32x32.mat) from http://ufldl.stanford.edu/housenumbers/ "
    "into <data.root>/svhn/ or <data.root>/, or run torchvision.datasets.SVHN(root, split='train', "
    "download=True) and split='test' (it puts the files in <root>/), or set data.download=true."
)


def _error(message: str) -> DataError:
    return DataError(f"{message}\n{HOW_TO_GET}")


def _candidates(root: Path, filename: str) -> list[Path]:
    return [root / "svhn" / filename, root / filename]


def _find(root: Path, filename: str) -> Path | None:
    return next((p for p in _candidates(root, filename) if p.is_file()), None)


def _download(root: Path) -> None:
    try:
        import torchvision

        for split in FILES:
            torchvision.datasets.SVHN(str(root), split=split, download=True)
    except Exception as err:  # no network, bad file ...
        raise _error(f"data.download=true but downloading SVHN into {root} failed: {err!r}") from err


def read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One .mat file -> (N, 3, 32, 32) uint8 images and (N,) int64 digit labels 0..9."""
    try:
        mat = scipy.io.loadmat(str(path))
    except Exception as err:  # truncated file, not a .mat, HDF5 (v7.3) file ...
        raise _error(f"cannot read {path} as a MATLAB .mat file: {err!r}.") from err
    for key in ("X", "y"):
        if key not in mat:
            found = sorted(k for k in mat if not k.startswith("__"))
            raise _error(f"{path}: missing variable {key!r} (found {found}).")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.dtype != np.uint8:
        raise _error(f"{path}: 'X' must be a 32 x 32 x 3 x N uint8 array, got {x.dtype} {x.shape}.")
    n = x.shape[3]
    if y.shape not in ((n, 1), (n,)) or not np.issubdtype(y.dtype, np.integer):
        raise _error(f"{path}: 'y' must be an {n} x 1 integer array, got {y.dtype} {y.shape}.")
    y = y.reshape(-1).astype(np.int64)
    if n and (y.min() < 1 or y.max() > 10):
        raise _error(f"{path}: labels in 'y' must lie in 1..10, got [{y.min()}, {y.max()}].")
    y[y == 10] = 0  # SVHN writes the digit 0 as label 10
    # (H, W, C, N) -> (N, C, H, W)
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y


OFFICIAL_TRAIN, OFFICIAL_TEST = 73_257, 26_032  # format 2, without "extra"


class SVHNTask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        val = round(VAL_FRACTION * OFFICIAL_TRAIN)  # as carve_validation
        return capped_sizes({"train": OFFICIAL_TRAIN - val, "val": val, "test": OFFICIAL_TEST}, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return 1

    def source_files(self, data_cfg) -> list[Path]:
        root = Path(data_cfg.root)
        return [_find(root, f) or _candidates(root, f)[0] for f in FILES.values()]

    def open(self, data_cfg) -> TaskSource:
        root = Path(data_cfg.root)
        if data_cfg.download and any(_find(root, f) is None for f in FILES.values()):
            _download(root)
        data = {}
        for split, filename in FILES.items():
            path = _find(root, filename)
            if path is None:
                tried = " or ".join(str(p) for p in _candidates(root, filename))
                raise _error(f"SVHN {split} file not found: expected {tried}.")
            data[split] = read_mat(path)

        train_x, train_y = data["train"]
        train_idx, val_idx = carve_validation(len(train_x), VAL_FRACTION)
        parts = {
            "train": (train_x[train_idx], train_y[train_idx]),
            "val": (train_x[val_idx], train_y[val_idx]),
            "test": data["test"],
        }
        splits = {split: SplitSource(labels=y.reshape(-1, 1), read_blocks=array_blocks(x, data_cfg.image_size))
                  for split, (x, y) in parts.items()}

        spec = TaskSpec(
            dataset="svhn",
            task_names=("digit",),
            num_classes=(10,),
            mean=MEAN,
            std=STD,
            pad_crop=data_cfg.image_size // 8,  # 4 px at 32: small shifts keep the digit centred
            # No flips: a mirrored digit is either not a digit or a different one (2 vs 5-like
            # shapes), and the crops contain neighbouring digits whose left/right order matters.
            hflip=False,
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("svhn")(SVHNTask())
