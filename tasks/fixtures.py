"""Tiny data sets written in exactly the official on-disk formats (described in docs/guides/data.md).

Helpers, not tests: each writes under ``root`` the files a task module reads and returns what a
test needs to check the result (paths and the labels written).
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

CELEBA_ATTRIBUTES = (  # the 40 names of line 2 of list_attr_celeba.txt, in order
    "5_o_Clock_Shadow",
    "Arched_Eyebrows",
    "Attractive",
    "Bags_Under_Eyes",
    "Bald",
    "Bangs",
    "Big_Lips",
    "Big_Nose",
    "Black_Hair",
    "Blond_Hair",
    "Blurry",
    "Brown_Hair",
    "Bushy_Eyebrows",
    "Chubby",
    "Double_Chin",
    "Eyeglasses",
    "Goatee",
    "Gray_Hair",
    "Heavy_Makeup",
    "High_Cheekbones",
    "Male",
    "Mouth_Slightly_Open",
    "Mustache",
    "Narrow_Eyes",
    "No_Beard",
    "Oval_Face",
    "Pale_Skin",
    "Pointy_Nose",
    "Receding_Hairline",
    "Rosy_Cheeks",
    "Sideburns",
    "Smiling",
    "Straight_Hair",
    "Wavy_Hair",
    "Wearing_Earrings",
    "Wearing_Hat",
    "Wearing_Lipstick",
    "Wearing_Necklace",
    "Wearing_Necktie",
    "Young",
)


@dataclass
class CelebAFixture:
    folder: Path  # <root>/celeba
    attr_file: Path
    partition_file: Path
    image_dir: Path
    names: list[str]  # image file names, in file order
    values: np.ndarray  # (n, 40) of +-1, as written
    partition: np.ndarray  # (n,) of 0/1/2
    split_names: dict[str, list[str]] = field(default_factory=dict)  # split -> image names in order


def write_celeba(root: Path, n: int = 60, image_size: tuple[int, int] = (178, 218), seed: int = 0,
                 distinct_images: int | None = None) -> CelebAFixture:
    """``<root>/celeba/``: ``n`` random JPEGs (width x height = image_size) and the two text files.

    The partition interleaves the splits (0,0,0,1,2, ...): every split is non-empty and, unlike
    the real file (contiguous blocks), a split's n-th image is not the file's n-th image.
    ``distinct_images=k`` encodes only k JPEGs and hard-links the other names to them (a
    202,599-image folder for benchmarks in seconds, without 6 GB of noise JPEGs); each name is
    still a file that the reader opens and decodes.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "celeba"
    image_dir = folder / "img_align_celeba"
    image_dir.mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(1, n + 1)]
    width, height = image_size
    distinct = n if distinct_images is None else max(1, min(n, distinct_images))
    for i, name in enumerate(names):
        path = image_dir / name
        if i < distinct:
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path, quality=90)
        else:
            path.unlink(missing_ok=True)
            os.link(image_dir / names[i % distinct], path)

    values = rng.choice(np.array([-1, 1]), size=(n, len(CELEBA_ATTRIBUTES)))
    # the official file pads single-digit values with two spaces ("  1" / " -1")
    lines = [str(n), " ".join(CELEBA_ATTRIBUTES)]
    lines += [name + "".join(f" {v:2d}" for v in row) for name, row in zip(names, values)]
    attr_file = folder / "list_attr_celeba.txt"
    attr_file.write_text("\n".join(lines) + "\n")

    partition = np.array([0, 0, 0, 1, 2] * (n // 5 + 1))[:n]  # 60 % / 20 % / 20 %
    partition_file = folder / "list_eval_partition.txt"
    partition_file.write_text("".join(f"{name} {p}\n" for name, p in zip(names, partition)))

    split_names = {s: [nm for nm, p in zip(names, partition) if p == c] for c, s in enumerate(("train", "val", "test"))}
    return CelebAFixture(folder, attr_file, partition_file, image_dir, names, values, partition, split_names)


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are Python 2 pickles


def _cifar_batch(rng: np.random.Generator, n: int, num_classes: int, label_key: bytes) -> dict:
    return {
        b"batch_label": b"fixture",
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        label_key: [int(v) for v in rng.integers(0, num_classes, size=n)],  # a list, as official
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


def write_cifar10(root: Path, n_train_per_batch: int = 20, n_test: int = 30, seed: int = 0) -> Path:
    """``<root>/cifar-10-batches-py/``: data_batch_1..5, test_batch, batches.meta. Returns the folder."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, 6):
        _pickle(folder / f"data_batch_{i}", _cifar_batch(rng, n_train_per_batch, 10, b"labels"))
    _pickle(folder / "test_batch", _cifar_batch(rng, n_test, 10, b"labels"))
    classes = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    names = [s.encode() for s in classes]
    _pickle(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": n_train_per_batch})
    return folder


def write_cifar100(root: Path, n_train: int = 100, n_test: int = 30, seed: int = 0) -> Path:
    """``<root>/cifar-100-python/``: train, test, meta (fine and coarse labels). Returns the folder."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        batch = _cifar_batch(rng, n, 100, b"fine_labels")
        batch[b"coarse_labels"] = [int(v) for v in rng.integers(0, 20, size=n)]
        _pickle(folder / name, batch)
    meta = {
        b"fine_label_names": [f"class{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"super{i}".encode() for i in range(20)],
    }
    _pickle(folder / "meta", meta)
    return folder


def write_svhn(
    root: Path, n_train: int = 50, n_test: int = 20, subfolder: bool = True, seed: int = 0
) -> dict[str, Path]:
    """``train_32x32.mat`` / ``test_32x32.mat`` in ``<root>/svhn/`` (or ``<root>/`` if not subfolder).

    Labels cycle through 1..10 so label 10 (digit 0) is always present. Returns split -> path.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "svhn" if subfolder else Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)  # official y is uint8, N x 1
        paths[split] = folder / f"{split}_32x32.mat"
        scipy.io.savemat(str(paths[split]), {"X": x, "y": y})
    return paths


def write_bomb_jpeg(path: Path, width: int = 60_000, height: int = 60_000) -> Path:
    """A few-hundred-byte JPEG whose header claims ``width`` x ``height`` pixels (a decompression bomb).

    Written as a valid 16 x 16 baseline JPEG whose SOF0 frame header is then patched: a reader
    that trusts the header would allocate ``3 * width * height`` bytes (10.8 GB by default).
    """
    path = Path(path)
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(path, quality=90)
    data = bytearray(path.read_bytes())
    sof = data.find(b"\xff\xc0")  # SOF0: marker, length (2), precision (1), height (2), width (2)
    if sof < 0:
        raise RuntimeError(f"{path}: PIL wrote no baseline SOF0 marker")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(data))
    return path


def write_cifar_c(root: Path, corruptions: tuple[str, ...] = ("gaussian_noise",), variant: str = "cifar10") -> Path:
    """``<root>/CIFAR-10-C/`` (or ``CIFAR-100-C``) in the official format for the fixture's test set of T images.

    ``<name>.npy``: (5·T, 32, 32, 3) uint8, severity s in rows (s − 1)·T .. s·T − 1 (for the real
    CIFAR test set, (50000, 32, 32, 3)); ``labels.npy``: (5·T,), the test labels five times. The
    "corruption" is the test image plus 20·s (clipped), so a test can tell which rows were read.
    Needs ``write_cifar10`` / ``write_cifar100`` first. Returns the folder.
    """
    test_path, key, folder_name = {
        "cifar10": ("cifar-10-batches-py/test_batch", b"labels", "CIFAR-10-C"),
        "cifar100": ("cifar-100-python/test", b"fine_labels", "CIFAR-100-C"),
    }[variant]
    with open(Path(root) / test_path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    folder = Path(root) / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    for name in corruptions:
        levels = [np.clip(images.astype(np.int64) + 20 * s, 0, 255).astype(np.uint8) for s in range(1, 6)]
        np.save(folder / f"{name}.npy", np.concatenate(levels))
    np.save(folder / "labels.npy", np.tile(np.asarray(batch[key], dtype=np.uint8), 5))  # uint8, as official
    return folder


FASHION_LAYOUTS = {"official": "fashion-mnist", "torchvision": "FashionMNIST/raw"}
IDX_MAGIC = {"images": 0x00000803, "labels": 0x00000801}


def write_idx(path: Path, values: np.ndarray, magic: int | None = None, gz: bool | None = None) -> Path:
    """``values`` (uint8) as an IDX file: big-endian magic, one int32 size per dimension, the bytes.

    ``magic`` defaults to 0x0800 + the number of dimensions (uint8); ``gz`` defaults to whether
    ``path`` ends in ``.gz``. Tests pass a wrong magic on purpose.
    """
    path = Path(path)
    values = np.ascontiguousarray(values, dtype=np.uint8)
    magic = 0x00000800 + values.ndim if magic is None else magic
    data = struct.pack(f">I{values.ndim}I", magic, *values.shape) + values.tobytes()
    gz = path.name.endswith(".gz") if gz is None else gz
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        import gzip

        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)
    return path


@dataclass
class FashionFixture:
    folder: Path
    files: dict[str, Path]  # file stem (e.g. "train-images-idx3-ubyte") -> path written
    images: dict[str, np.ndarray]  # "train"/"test" -> (n, 28, 28) uint8, as written
    labels: dict[str, np.ndarray]  # "train"/"test" -> (n,) uint8


def write_fashion_mnist(root: Path, n_train: int = 50, n_test: int = 20, layout: str = "official",
                        gz: bool = True, seed: int = 0) -> FashionFixture:
    """The four official Fashion-MNIST IDX files in ``<root>/fashion-mnist/`` or torchvision's ``FashionMNIST/raw/``.

    Labels cycle through 0..9 (every class present, equal counts when n is a multiple of 10);
    images are random 28x28 uint8.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / FASHION_LAYOUTS[layout]
    files, images, labels = {}, {}, {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        labels[split] = (np.arange(n) % 10).astype(np.uint8)
        images[split] = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        for kind, values in (("images", images[split]), ("labels", labels[split])):
            stem = f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"
            files[stem] = write_idx(folder / (stem + (".gz" if gz else "")), values, IDX_MAGIC[kind])
    return FashionFixture(folder, files, images, labels)
