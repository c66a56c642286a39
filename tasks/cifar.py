"""``cifar10`` and ``cifar100``: one multi-class task ``class``, read from the official pickles.

Layout (under ``<data.root>/``, as the official archives and torchvision unpack them)::

    cifar-10-batches-py/data_batch_1 .. data_batch_5, test_batch, batches.meta
    cifar-100-python/train, test, meta

Each batch is a pickled dict: ``b'data'`` (N x 3072 uint8, channel-major 3x32x32) and
``b'labels'`` (CIFAR-10) or ``b'fine_labels'`` (CIFAR-100). We read the pickles ourselves because
torchvision's readers insist on the MD5 sums of the official files.

The validation split is carved from the official training set with a fixed permutation
(``numpy.random.default_rng(0)``): 20 % for CIFAR-10, 5 % for CIFAR-100 (fewer images per class
there, so the training set keeps more). The official test set stays the test split.

The images are resized block by block when read (``array_blocks``). ``resize_square``,
``array_blocks`` and ``carve_validation`` are shared with the other small-image tasks.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mtl_cog.data.task_api import TASKS, ReadBlocks, SplitSource, TaskSource, TaskSpec, block_ranges, capped_sizes
from mtl_cog.errors import DataError

VAL_SEED = 0


def carve_validation(n: int, fraction: float, seed: int = VAL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (train, val) index arrays with a fixed random permutation.

    Both are sorted, so "the first N of a split" (``data.max_samples``) keeps file order.
    """
    perm = np.random.default_rng(seed).permutation(n)
    n_val = round(fraction * n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def array_blocks(images: np.ndarray, size: int) -> ReadBlocks:
    """``read_blocks`` over in-memory (N, 3, h, w) uint8 images, each block resized to ``size``."""

    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        for start, end in block_ranges(min(stop, len(images)), size):
            block = torch.from_numpy(np.ascontiguousarray(images[start:end]))
            yield resize_square(block, size).numpy()

    return read_blocks


def resize_square(images: torch.Tensor, size: int, chunk: int = 1024) -> torch.Tensor:
    """(N, 3, h, w) uint8 -> (N, 3, size, size) uint8 with antialiased bilinear interpolation.

    Done in chunks: the float copy of 50,000 images at 224 px would need ~30 GB at once.
    """
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((len(images), images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk].float()
        block = F.interpolate(block, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out[start : start + chunk] = block.round().clamp(0, 255).to(torch.uint8)
    return out


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickles what the CIFAR files hold (dicts, lists, bytes, numpy arrays) and nothing else.

    A plain ``pickle.load`` runs whatever code a tampered file names; this refuses every global
    outside numpy's array reconstruction, so a bad file is an error, never executed code.
    """

    ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}: not part of a CIFAR batch")
        return super().find_class(module, name)


@dataclass(frozen=True)
class _Variant:
    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: bytes
    names_key: bytes
    num_classes: int
    val_fraction: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    torchvision_class: str
    corrupted_folder: str  # Hendrycks & Dietterich's CIFAR-10-C / CIFAR-100-C, unpacked under data.root


CIFAR10 = _Variant(
    name="cifar10",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_file="test_batch",
    meta_file="batches.meta",
    label_key=b"labels",
    names_key=b"label_names",
    num_classes=10,
    val_fraction=0.2,
    mean=(0.4914, 0.4822, 0.4465),  # per-channel statistics of the training images
    std=(0.2470, 0.2435, 0.2616),
    torchvision_class="CIFAR10",
    corrupted_folder="CIFAR-10-C",
)
CIFAR100 = _Variant(
    name="cifar100",
    folder="cifar-100-python",
    train_files=("train",),
    test_file="test",
    meta_file="meta",
    label_key=b"fine_labels",
    names_key=b"fine_label_names",
    num_classes=100,
    val_fraction=0.05,
    mean=(0.5071, 0.4865, 0.4409),
    std=(0.2673, 0.2564, 0.2762),
    torchvision_class="CIFAR100",
    corrupted_folder="CIFAR-100-C",
)


OFFICIAL_TRAIN, OFFICIAL_TEST = 50_000, 10_000  # both CIFARs; the validation split is carved from train


class CifarTask:
    def __init__(self, variant: _Variant) -> None:
        self.v = variant

    def split_sizes(self, data_cfg) -> dict[str, int]:
        val = round(self.v.val_fraction * OFFICIAL_TRAIN)  # as carve_validation
        return capped_sizes({"train": OFFICIAL_TRAIN - val, "val": val, "test": OFFICIAL_TEST}, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return 1

    def _how_to_get(self) -> str:
        return (
            f"Get {self.v.name.upper()} (python version) from https://www.cs.toronto.edu/~kriz/cifar.html and "
            f"unpack it into <data.root>/ (giving <data.root>/{self.v.folder}/), or run "
            f"torchvision.datasets.{self.v.torchvision_class}(root, download=True), or set data.download=true."
        )

    def _error(self, message: str) -> DataError:
        return DataError(f"{message}\n{self._how_to_get()}")

    def source_files(self, data_cfg) -> list[Path]:
        folder = Path(data_cfg.root) / self.v.folder
        return [folder / f for f in (*self.v.train_files, self.v.test_file, self.v.meta_file)]

    def _download(self, root: Path) -> None:
        try:
            import torchvision

            getattr(torchvision.datasets, self.v.torchvision_class)(str(root), download=True)
        except Exception as err:  # no network, bad archive ...
            raise self._error(f"data.download=true but downloading {self.v.name} into {root} failed: {err!r}") from err

    def _unpickle(self, path: Path, keys: tuple[bytes, ...]) -> dict:
        try:
            with open(path, "rb") as f:
                obj = _ArraysOnlyUnpickler(f, encoding="bytes").load()
        except FileNotFoundError:
            raise self._error(f"{self.v.name} file not found: {path}.") from None
        except Exception as err:  # truncated or not a pickle at all
            raise self._error(f"cannot read {path} as a CIFAR pickle: {err!r}.") from err
        if not isinstance(obj, dict):
            raise self._error(f"{path}: expected a pickled dict, got {type(obj).__name__}.")
        for key in keys:
            if key not in obj:
                raise self._error(f"{path}: missing key {key!r} (has {sorted(obj)}).")
        return obj

    def _read_batch(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """One batch -> (N, 3, 32, 32) uint8 images and (N,) int64 labels, validated."""
        obj = self._unpickle(path, (b"data", self.v.label_key))
        data = np.asarray(obj[b"data"])
        labels = np.asarray(obj[self.v.label_key])
        if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
            raise self._error(
                f"{path}: b'data' must be an (N, 3072) uint8 array, got {data.dtype} {tuple(data.shape)}."
            )
        if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
            raise self._error(
                f"{path}: {self.v.label_key!r} must hold {len(data)} integers, "
                f"got {labels.dtype} {tuple(labels.shape)}."
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.v.num_classes):
            raise self._error(
                f"{path}: labels must lie in [0, {self.v.num_classes}), got [{labels.min()}, {labels.max()}]."
            )
        return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)

    def official_corruption(self, data_cfg, name: str, severity: int, n: int):
        """The first ``n`` test images of ``<data.root>/CIFAR-10-C/<name>.npy`` at ``severity`` -> (images
        (n, 3, S, S) uint8, labels (n,), path), or None when that file is not there (then mtl_cog corrupts).

        The official format (Hendrycks & Dietterich, zenodo.org/record/2535967): (5·T, 32, 32, 3) uint8,
        the T test images at severity 1, then 2, ... 5, and ``labels.npy`` (5·T,) beside them.
        """
        folder = Path(data_cfg.root) / self.v.corrupted_folder
        path = folder / f"{name}.npy"
        if not path.is_file():
            return None
        test_count = len(self._read_batch(Path(data_cfg.root) / self.v.folder / self.v.test_file)[1])
        expected = (5 * test_count, 32, 32, 3)
        try:
            images = np.load(path, mmap_mode="r")
            labels = np.load(folder / "labels.npy", mmap_mode="r")
        except (OSError, ValueError) as err:
            raise DataError(f"{path} or its labels.npy cannot be read ({err}); expected the official "
                            f"{self.v.corrupted_folder} files.") from None
        if images.shape != expected or images.dtype != np.uint8:
            raise DataError(f"{path}: {images.dtype} of shape {images.shape}, expected uint8 of shape {expected} "
                            f"(5 severities x {test_count} test images, as the official {self.v.corrupted_folder}).")
        if labels.shape != (expected[0],):
            raise DataError(f"{folder / 'labels.npy'}: shape {labels.shape}, expected ({expected[0]},).")
        rows = slice((severity - 1) * test_count, (severity - 1) * test_count + n)
        block = torch.from_numpy(np.ascontiguousarray(images[rows]).transpose(0, 3, 1, 2).copy())
        return resize_square(block, data_cfg.image_size).numpy(), np.asarray(labels[rows]), path

    def open(self, data_cfg) -> TaskSource:
        root = Path(data_cfg.root)
        if data_cfg.download and not all(p.exists() for p in self.source_files(data_cfg)):
            self._download(root)
        if not (root / self.v.folder).is_dir():
            raise self._error(f"{self.v.name} not found: folder {root / self.v.folder} does not exist.")

        folder = root / self.v.folder
        meta_path = folder / self.v.meta_file
        class_names = self._unpickle(meta_path, (self.v.names_key,))[self.v.names_key]
        if len(class_names) != self.v.num_classes:
            raise self._error(f"{meta_path}: expected {self.v.num_classes} class names, got {len(class_names)}.")

        batches = [self._read_batch(folder / f) for f in self.v.train_files]
        train_x = np.concatenate([b[0] for b in batches])
        train_y = np.concatenate([b[1] for b in batches])
        test_x, test_y = self._read_batch(folder / self.v.test_file)

        train_idx, val_idx = carve_validation(len(train_x), self.v.val_fraction)
        parts = {
            "train": (train_x[train_idx], train_y[train_idx]),
            "val": (train_x[val_idx], train_y[val_idx]),
            "test": (test_x, test_y),
        }
        splits = {split: SplitSource(labels=y.reshape(-1, 1), read_blocks=array_blocks(x, data_cfg.image_size))
                  for split, (x, y) in parts.items()}

        spec = TaskSpec(
            dataset=self.v.name,
            task_names=("class",),
            num_classes=(self.v.num_classes,),
            mean=self.v.mean,
            std=self.v.std,
            # the standard CIFAR augmentation (pad 4, random 32x32 crop, flip), scaled with the size
            pad_crop=data_cfg.image_size // 8,
            hflip=True,
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("cifar10")(CifarTask(CIFAR10))
TASKS.register("cifar100")(CifarTask(CIFAR100))
