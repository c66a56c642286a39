"""``fashion_mnist``: Zalando's Fashion-MNIST, one 10-class task ``item``, read from the official IDX files.

Xiao, Rasul & Vollgraf (2017), "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine
Learning Algorithms", arXiv:1708.07747. 70,000 grey 28x28 photographs of Zalando articles, ten
classes (``CLASSES``), 6,000 per class in the training set and 1,000 in the test set. Several
classes are genuinely confusable (shirt / T-shirt / pullover / coat), so a small CNN stays
around 90 % accurate: a real calibration problem at CPU scale.

Files (the four official ones, gzipped or not): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``. Looked up, as one set, in

1. ``<data.root>/fashion-mnist/`` (the official layout),
2. ``<data.root>/FashionMNIST/raw/`` (where ``torchvision.datasets.FashionMNIST`` puts them),
3. ``DEBIAN_FOLDER`` (``apt-get install dataset-fashion-mnist``) when ``data.root`` holds none.

IDX (LeCun's MNIST format): a big-endian header, magic ``0x00000803`` + three int32 sizes
(N, 28, 28) for images, ``0x00000801`` + N for labels, then the uint8 values. Every header field,
the exact file length and the label range (0..9) are checked: a damaged file stops with one error
naming it, before anything is cached.

The validation split is a fixed, stratified 20 % of the official training set (``stratified_validation``:
per class, ``default_rng(0)``), so every class keeps 4,800 training and 1,200 validation
images; the official test set is the test split. Images are resized to ``data.image_size``
(antialiased bilinear, as the other small-image tasks) and copied to three channels.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from mtl_cog.data.task_api import TASKS, SplitSource, TaskSource, TaskSpec, capped_sizes
from mtl_cog.errors import DataError
from tasks.cifar import VAL_SEED, array_blocks

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
FILES = {  # (split of the official release, kind) -> file name without ".gz"
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801  # 0x08 = unsigned byte; 3 or 1 dimensions
SIDE = 28
OFFICIAL_TRAIN, OFFICIAL_TEST = 60_000, 10_000
VAL_FRACTION = 0.2
DEBIAN_FOLDER = Path("/usr/share/datasets/fashion-mnist")  # Debian/Ubuntu package dataset-fashion-mnist
LAYOUTS = ("fashion-mnist", "FashionMNIST/raw")  # under data.root: official, torchvision
# Mean and standard deviation of the 60,000 official training images on the [0, 1] scale
# (the values Fashion-MNIST users normalise with); resizing to 32 px changes them by < 0.002.
MEAN, STD = 0.2860, 0.3530

HOW_TO_GET = (
    "Get Fashion-MNIST with `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu; read from "
    f"{DEBIAN_FOLDER}/ when data.root holds no copy), or set data.download=true (torchvision.datasets."
    "FashionMNIST, into <data.root>/FashionMNIST/raw/); or put the four official IDX files "
    "(https://github.com/zalandoresearch/fashion-mnist) in <data.root>/fashion-mnist/."
)


def _error(message: str) -> DataError:
    """One line: what is wrong with which file, then the ways to get the files."""
    return DataError(f"{message} {HOW_TO_GET}")


def _find_in(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz`` (plain first: torchvision keeps both, plain reads faster)."""
    return next((p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file()), None)


def candidate_folders(root: Path) -> list[Path]:
    return [root / layout for layout in LAYOUTS] + [DEBIAN_FOLDER]


def find_folder(root: Path) -> Path:
    """The first folder holding all four files; a folder under ``data.root`` holding only some is an error."""
    for folder in candidate_folders(root):
        found = {stem: _find_in(folder, stem) for stem in FILES.values()}
        if all(found.values()):
            return folder
        missing = [stem for stem, path in found.items() if path is None]
        if len(missing) < len(FILES) and folder != DEBIAN_FOLDER:
            raise _error(f"Fashion-MNIST file not found: {folder / missing[0]}[.gz] (the folder holds "
                         f"{len(FILES) - len(missing)} of the four official files).")
    tried = ", ".join(f"{f}/" for f in candidate_folders(root))
    raise _error(f"Fashion-MNIST not found: none of {tried} holds {FILES['train', 'images']}[.gz] and the "
                 "three other official files.")


CHUNK = 1 << 20  # bytes inflated per read: a file that inflates beyond its header's length is stopped within one


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _read_at_most(handle, limit: int) -> bytes:
    """Up to ``limit`` bytes, in chunks: one read of a huge size would allocate all of it at once."""
    data = bytearray()
    while len(data) < limit:
        chunk = handle.read(min(CHUNK, limit - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_idx(path: Path, magic: int, shape_tail: tuple[int, ...]) -> np.ndarray:
    """One IDX file -> uint8 array of shape (N, *shape_tail), every header field and the length checked.

    The header is read first and bounds the rest: a file whose header announces more than the
    memory available is refused before reading, and a ``.gz`` that inflates beyond the announced
    length (a damaged or foreign file can inflate to gigabytes) is stopped one chunk past it.
    """
    dims = 1 + len(shape_tail)
    header = 4 * (1 + dims)
    try:
        with _open(path) as handle:
            head = _read_at_most(handle, header)
            if len(head) < header:
                raise _error(f"{path}: {len(head)} bytes, shorter than the {header}-byte IDX header (truncated).")
            found = struct.unpack(">I", head[:4])[0]
            if found != magic:
                raise _error(f"{path}: IDX magic number 0x{found:08x}, expected 0x{magic:08x} "
                             f"({'images' if magic == IMAGE_MAGIC else 'labels'}, uint8, {dims} dimension(s)).")
            shape = struct.unpack(f">{dims}I", head[4:header])
            if tuple(shape[1:]) != shape_tail:
                raise _error(f"{path}: IDX sizes {shape}, expected (N, {', '.join(map(str, shape_tail))}).")
            announced = int(np.prod(shape, dtype=np.int64))
            available = psutil.virtual_memory().available
            if announced > available:
                raise _error(f"{path}: its header announces {shape[0]:,} items ({announced / 2**30:,.1f} GiB), more "
                             f"than the {available / 2**30:.1f} GiB of memory available: not a Fashion-MNIST file.")
            body = _read_at_most(handle, announced + 1)  # one byte more: trailing bytes
    except (OSError, EOFError, zlib.error) as err:  # truncated, not gzip at all, or damaged deflate data
        raise _error(f"cannot read {path}: {err}.") from None
    if len(body) != announced:
        what = "truncated" if len(body) < announced else "trailing bytes"
        raise _error(f"{path}: {header + len(body)}{'+' if len(body) > announced else ''} bytes, its header announces "
                     f"{header + announced} ({what}).")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape).copy()  # writable, for torch


@dataclass
class Official:
    """The official release read into memory: (N, 28, 28) uint8 images and (N,) int64 labels per split."""

    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    files: dict[tuple[str, str], Path]


def read_official(folder: Path) -> Official:
    """The four files of ``folder``, checked against each other (counts, label range)."""
    files = {key: _find_in(folder, stem) for key, stem in FILES.items()}
    images, labels = {}, {}
    for split in ("train", "test"):
        x = read_idx(files[split, "images"], IMAGE_MAGIC, (SIDE, SIDE))
        y = read_idx(files[split, "labels"], LABEL_MAGIC, ())
        if len(x) != len(y):
            raise _error(f"{files[split, 'labels']} holds {len(y)} labels but {files[split, 'images']} "
                         f"holds {len(x)} images; use the files of one release.")
        if len(y) and y.max() > 9:
            row = int(np.argmax(y > 9))
            raise _error(f"{files[split, 'labels']}: label {int(y[row])} at item {row}; Fashion-MNIST labels "
                         "lie in 0..9.")
        images[split], labels[split] = x, y.astype(np.int64)
    return Official(images, labels, files)


def download(root: Path) -> None:
    """``data.download=true``: torchvision fetches and unpacks into ``<root>/FashionMNIST/raw/``."""
    try:
        import torchvision

        for train in (True, False):
            torchvision.datasets.FashionMNIST(str(root), train=train, download=True)
    except Exception as err:  # no network, bad archive ...
        raise _error(f"data.download=true but downloading Fashion-MNIST into {root / 'FashionMNIST'} "
                     f"failed: {err!r}") from err


def locate(data_cfg) -> Path:
    """The folder to read, downloading first where asked and ``data.root`` holds no complete copy."""
    root = Path(data_cfg.root)
    if data_cfg.download and not any(all(_find_in(root / layout, s) for s in FILES.values()) for layout in LAYOUTS):
        download(root)
    return find_folder(root)


def source_files(data_cfg) -> list[Path]:
    """The four files that would be read (for cache fingerprints); the official names where none is found."""
    try:
        folder = find_folder(Path(data_cfg.root))
    except DataError:
        return [Path(data_cfg.root) / LAYOUTS[0] / stem for stem in FILES.values()]
    return [_find_in(folder, stem) for stem in FILES.values()]


def stratified_validation(labels: np.ndarray, fraction: float = VAL_FRACTION,
                          seed: int = VAL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices with ``round(fraction * n_c)`` of each class c in val, fixed by ``seed``; both sorted."""
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        val.append(rng.permutation(members)[: round(fraction * len(members))])
    val = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    train = np.setdiff1d(np.arange(len(labels)), val)
    return train, val


def official_splits(official: Official) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """train / val (stratified 80/20 of the official training set) / test: (images, labels) each."""
    train_idx, val_idx = stratified_validation(official.labels["train"])
    x, y = official.images["train"], official.labels["train"]
    return {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx]),
            "test": (official.images["test"], official.labels["test"])}


def to_rgb(images: np.ndarray) -> np.ndarray:
    """(N, H, W) grey uint8 -> (N, 3, H, W), a broadcast view (copied block by block when read)."""
    return np.broadcast_to(images[:, None], (len(images), 3, *images.shape[1:]))


class FashionMNISTTask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        val = round(VAL_FRACTION * OFFICIAL_TRAIN)  # 1,200 per class, as stratified_validation
        return capped_sizes({"train": OFFICIAL_TRAIN - val, "val": val, "test": OFFICIAL_TEST}, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return 1

    def source_files(self, data_cfg) -> list[Path]:
        return source_files(data_cfg)

    def open(self, data_cfg) -> TaskSource:
        parts = official_splits(read_official(locate(data_cfg)))
        splits = {split: SplitSource(labels=y.reshape(-1, 1), read_blocks=array_blocks(to_rgb(x), data_cfg.image_size))
                  for split, (x, y) in parts.items()}
        spec = TaskSpec(
            dataset="fashion_mnist",
            task_names=("item",),
            num_classes=(10,),
            mean=(MEAN,) * 3,
            std=(STD,) * 3,
            pad_crop=data_cfg.image_size // 8,  # the MNIST-style shift augmentation, scaled with the size
            hflip=True,  # a mirrored shoe or shirt is the same class (no class names a side)
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("fashion_mnist")(FashionMNISTTask())
