"""``celeba``: CelebA's 40 binary face attributes, read from the official files.

Layout (``<data.root>/celeba/``, where ``torchvision.datasets.CelebA`` also puts it)::

    img_align_celeba/000001.jpg ... 202599.jpg   178x218 aligned face crops
    list_attr_celeba.txt     line 1: image count; line 2: 40 attribute names;
                             then "000001.jpg  -1  1 ..." (values +-1, runs of spaces)
    list_eval_partition.txt  "000001.jpg 0" with 0 = train, 1 = val, 2 = test

Labels map +1 -> 1 and -1 -> 0. Images are resized like torchvision's ``Resize(S)`` followed by
``CenterCrop(S)`` (shorter side to S, then the central S x S square) and stored as uint8. Only the
images that survive ``data.max_samples`` (the first N of each split, in file order) are decoded.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from mtl_cog.data.images import resize_center_crop
from mtl_cog.data.task_api import TASKS, SplitData, TaskData, TaskSpec, capped_sizes
from mtl_cog.errors import DataError

ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
IMAGE_DIR = "img_align_celeba"
SPLITS = ("train", "val", "test")  # partition codes 0, 1, 2

# Per-channel statistics of aligned CelebA on the [0, 1] scale (the values commonly used).
MEAN = (0.5063, 0.4258, 0.3832)
STD = (0.3107, 0.2904, 0.2897)

HOW_TO_GET = (
    "Get CelebA from its official site (https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html: "
    "img_align_celeba.zip, list_attr_celeba.txt, list_eval_partition.txt) and unpack it into "
    "<data.root>/celeba/, or run torchvision.datasets.CelebA(root, split='all', download=True) "
    "(it places the files under <root>/celeba/), or set data.download=true."
)


def _error(message: str) -> DataError:
    return DataError(f"{message}\n{HOW_TO_GET}")


def _folder(data_cfg) -> Path:
    return Path(data_cfg.root) / "celeba"


def _missing(folder: Path) -> list[Path]:
    needed = [folder, folder / ATTR_FILE, folder / PARTITION_FILE, folder / IMAGE_DIR]
    return [p for p in needed if not p.exists()]


def _download(root: Path) -> None:
    try:
        import torchvision

        torchvision.datasets.CelebA(str(root), split="all", download=True)
    except Exception as err:  # network, Google Drive quota, missing gdown, bad archive ...
        raise _error(f"data.download=true but downloading CelebA into {root / 'celeba'} failed: {err!r}") from err


def read_attributes(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Parse ``list_attr_celeba.txt`` -> (image names, attribute names, (N, A) int64 0/1 labels)."""
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise _error(f"{path}: expected an image count on line 1 and attribute names on line 2.")
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise _error(f"{path}, line 1: expected the image count, got {lines[0][:60]!r}.") from None
    attr_names = lines[1].split()
    if not attr_names:
        raise _error(f"{path}, line 2: expected the attribute names, found none.")

    names: list[str] = []
    rows: list[list[str]] = []
    line_numbers: list[int] = []
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split()  # split() absorbs the double spaces of the official file
        if not parts:
            continue  # tolerate blank lines (e.g. a trailing newline)
        if len(parts) != len(attr_names) + 1:
            raise _error(
                f"{path}, line {number}: expected an image name and {len(attr_names)} values "
                f"({len(attr_names) + 1} columns), got {len(parts)} columns."
            )
        names.append(parts[0])
        rows.append(parts[1:])
        line_numbers.append(number)
    if len(names) != count:
        raise _error(f"{path}: line 1 announces {count} images but the file lists {len(names)}.")

    # Validate all values at once: string compare on a numpy array is fast on 8 million cells.
    values = np.array(rows, dtype=str).reshape(len(rows), len(attr_names))
    bad = ~np.isin(values, ("1", "-1"))
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise _error(
            f"{path}, line {line_numbers[r]}: attribute {attr_names[c]!r} has value {str(values[r, c])!r}; "
            "CelebA attributes must be 1 or -1."
        )
    return names, attr_names, (values == "1").astype(np.int64)


def read_partition(path: Path, names: list[str], attr_path: Path) -> np.ndarray:
    """Parse ``list_eval_partition.txt`` -> split code (0/1/2) for each image of the attr file."""
    split_of: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
            raise _error(f"{path}, line {number}: expected '<image> <0|1|2>', got {line.strip()[:60]!r}.")
        split_of[parts[0]] = int(parts[1])
    known = set(names)
    extra = [n for n in split_of if n not in known]
    missing = [n for n in names if n not in split_of]
    if extra or missing:
        detail = (
            f"{path} lists {extra[0]!r}, which {attr_path.name} does not"
            if extra
            else f"{path} does not list {missing[0]!r}, which {attr_path.name} does"
        )
        raise _error(
            f"{detail} ({len(extra)} extra, {len(missing)} missing): the partition and attribute files "
            "disagree. Use the two files from the same CelebA release."
        )
    return np.array([split_of[n] for n in names], dtype=np.int64)


def load_image(path: Path, size: int) -> np.ndarray:
    """Decode one JPEG as torchvision's Resize(size) + CenterCrop(size) would -> (size, size, 3) uint8."""
    try:
        with Image.open(path) as img:
            return resize_center_crop(img, size)
    except FileNotFoundError:
        raise _error(f"missing image {path} (listed in {ATTR_FILE}).") from None
    except (OSError, SyntaxError, ValueError) as err:  # PIL's truncated/corrupt-file errors
        raise _error(f"cannot decode image {path} (truncated or corrupt JPEG: {err}).") from None


def load_images(paths: list[Path], size: int, desc: str) -> torch.Tensor:
    """Decode many images into a (N, 3, size, size) uint8 tensor.

    Threads give real parallelism here because PIL releases the GIL while decoding and
    resizing; each worker writes its own row of one preallocated array (no list of arrays).
    """
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    if not paths:
        return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()

    def work(i: int) -> None:
        out[i] = load_image(paths[i], size)

    pool = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1))
    try:
        # chunks bound the number of queued futures and let an error stop the rest quickly
        chunk = 2048
        with tqdm(total=len(paths), desc=desc, unit="img", disable=len(paths) < 5000) as bar:
            for start in range(0, len(paths), chunk):
                for _ in pool.map(work, range(start, min(start + chunk, len(paths)))):
                    bar.update()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


# The official partition (list_eval_partition.txt): what a dry run counts without reading the files.
OFFICIAL_SIZES = {"train": 162_770, "val": 19_867, "test": 19_962}


class CelebATask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        return capped_sizes(OFFICIAL_SIZES, data_cfg.max_samples)

    def source_files(self, data_cfg) -> list[Path]:
        # The two text files, plus the image folder (its mtime changes if images are added or
        # removed); listing 202,599 JPEGs for a fingerprint would cost more than it saves.
        folder = _folder(data_cfg)
        return [folder / ATTR_FILE, folder / PARTITION_FILE, folder / IMAGE_DIR]

    def load(self, data_cfg) -> TaskData:
        folder = _folder(data_cfg)
        if _missing(folder) and data_cfg.download:
            _download(Path(data_cfg.root))
        missing = _missing(folder)
        if missing:
            raise _error(f"CelebA not found: {missing[0]} does not exist.")

        attr_path = folder / ATTR_FILE
        names, attr_names, labels = read_attributes(attr_path)
        split_codes = read_partition(folder / PARTITION_FILE, names, attr_path)

        splits = {}
        for code, split in enumerate(SPLITS):
            index = np.flatnonzero(split_codes == code)  # file order
            if data_cfg.max_samples is not None:
                index = index[: data_cfg.max_samples]
            paths = [folder / IMAGE_DIR / names[i] for i in index]
            images = load_images(paths, data_cfg.image_size, desc=f"celeba {split}")
            splits[split] = SplitData(images=images, labels=torch.from_numpy(labels[index]))

        spec = TaskSpec(
            dataset="celeba",
            task_names=tuple(attr_names),
            num_classes=(2,) * len(attr_names),
            mean=MEAN,
            std=STD,
            pad_crop=0,  # aligned faces: the alignment is information, shifting would blur it
            hflip=True,  # faces are left-right symmetric and no attribute names a side
        )
        return TaskData(spec=spec, splits=splits)


TASKS.register("celeba")(CelebATask())
