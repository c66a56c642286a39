"""``celeba``: CelebA's 40 binary face attributes, read from the official files.

Layout (``<data.root>/celeba/``, where ``torchvision.datasets.CelebA`` also puts it)::

    img_align_celeba/000001.jpg ... 202599.jpg   178x218 aligned face crops
    list_attr_celeba.txt     line 1: image count; line 2: 40 attribute names;
                             then "000001.jpg  -1  1 ..." (values +-1, runs of spaces)
    list_eval_partition.txt  "000001.jpg 0" with 0 = train, 1 = val, 2 = test

Labels map +1 -> 1 and -1 -> 0. Images are resized like torchvision's ``Resize(S)`` followed by
``CenterCrop(S)`` (shorter side to S, then the central S x S square) and stored as uint8. Only the
images are decoded block by block (``image_blocks``), so memory does not grow with the data set;
``data.max_samples`` takes the first N of each split, in file order. An image whose header claims
more than ``MAX_PIXELS`` pixels (a decompression bomb) is refused before it is decoded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from mtl_cog.data.images import resize_center_crop
from mtl_cog.data.task_api import TASKS, ReadBlocks, SplitSource, TaskSource, TaskSpec, block_ranges, capped_sizes
from mtl_cog.errors import DataError

ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
IMAGE_DIR = "img_align_celeba"
SPLITS = ("train", "val", "test")  # partition codes 0, 1, 2
# Aligned CelebA images are 178 x 218 (38,804 pixels). PIL's own bomb limit (89 million pixels,
# a warning below twice that) would let 16 decoding threads allocate gigabytes; a face crop
# 430 times the official size is not a CelebA image.
MAX_PIXELS = 4096 * 4096

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


VALUE = {"1": 1, "-1": 0}  # list_attr_celeba.txt value -> label


def read_attributes(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Parse ``list_attr_celeba.txt`` -> (image names, attribute names, (N, A) int64 0/1 labels).

    Line by line into a preallocated int8 matrix: the 8 million values never exist as Python
    strings at once (that took 530 MB for the official file; this needs the labels and names).
    """
    with open(path) as handle:
        first, second = handle.readline(), handle.readline()
        if not second:
            raise _error(f"{path}: expected an image count on line 1 and attribute names on line 2.")
        try:
            count = int(first.strip())
        except ValueError:
            raise _error(f"{path}, line 1: expected the image count, got {first.strip()[:60]!r}.") from None
        attr_names = second.split()
        if not attr_names:
            raise _error(f"{path}, line 2: expected the attribute names, found none.")
        twice = sorted({a for a in attr_names if attr_names.count(a) > 1})
        if twice:  # two columns under one name: one attribute's metrics would be reported under the other's
            raise _error(f"{path}, line 2: attribute name(s) {twice} appear more than once; each column needs "
                         "its own name.")
        values = np.zeros((max(count, 0), len(attr_names)), dtype=np.int8)
        names: list[str] = []
        for number, line in enumerate(handle, start=3):
            parts = line.split()  # split() absorbs the double spaces of the official file
            if not parts:
                continue  # tolerate blank lines (e.g. a trailing newline)
            if len(parts) != len(attr_names) + 1:
                raise _error(
                    f"{path}, line {number}: expected an image name and {len(attr_names)} values "
                    f"({len(attr_names) + 1} columns), got {len(parts)} columns."
                )
            try:
                row = [VALUE[v] for v in parts[1:]]
            except KeyError:
                c = next(i for i, v in enumerate(parts[1:]) if v not in VALUE)
                raise _error(
                    f"{path}, line {number}: attribute {attr_names[c]!r} has value {parts[1 + c]!r}; "
                    "CelebA attributes must be 1 or -1."
                ) from None
            if len(names) < len(values):
                values[len(names)] = row
            names.append(parts[0])
    if len(names) != count:
        raise _error(f"{path}: line 1 announces {count} images but the file lists {len(names)}.")
    return names, attr_names, values.astype(np.int64)


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
            # Image.open reads only the header: refuse a decompression bomb before decoding it.
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise _error(
                    f"image {path} claims {width} x {height} pixels, more than the {MAX_PIXELS:,} allowed "
                    "for a CelebA face crop (178 x 218): a decompression bomb or not an aligned CelebA "
                    "image. Replace it with the official file."
                )
            return resize_center_crop(img, size)
    except FileNotFoundError:
        raise _error(f"missing image {path} (listed in {ATTR_FILE}).") from None
    except Image.DecompressionBombError as err:  # PIL's own limit, should ours ever be raised above it
        raise _error(f"image {path} is a decompression bomb ({err}). Replace it with the official file.") from None
    except (OSError, SyntaxError, ValueError) as err:  # PIL's truncated/corrupt-file errors
        raise _error(f"cannot decode image {path} (truncated or corrupt JPEG: {err}).") from None


def image_blocks(image_dir: Path, names: list[str], size: int) -> ReadBlocks:
    """``read_blocks`` over ``image_dir/name``: each block decoded by a thread pool into one (n, 3, S, S) array.

    Threads give real parallelism here because PIL releases the GIL while decoding and resizing;
    each worker writes its own row of the block (no list of arrays). Memory is one block.
    """

    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        pool = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1))
        try:
            for start, end in block_ranges(min(stop, len(names)), size):
                block = np.empty((end - start, 3, size, size), dtype=np.uint8)

                def work(i: int, block=block, start=start) -> None:
                    block[i] = load_image(image_dir / names[start + i], size).transpose(2, 0, 1)

                list(pool.map(work, range(end - start)))  # list(): re-raises the first error
                yield block
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return read_blocks


# The official partition (list_eval_partition.txt): what a dry run counts without reading the files.
OFFICIAL_SIZES = {"train": 162_770, "val": 19_867, "test": 19_962}


class CelebATask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        return capped_sizes(OFFICIAL_SIZES, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return 40  # the official attribute file's columns (checked when it is read)

    def source_files(self, data_cfg) -> list[Path]:
        # The two text files, plus the image folder (its mtime changes if images are added or
        # removed); listing 202,599 JPEGs for a fingerprint would cost more than it saves. A
        # damaged cache is caught by its checksums (mtl_cog/data/cache.py), not by this.
        folder = _folder(data_cfg)
        return [folder / ATTR_FILE, folder / PARTITION_FILE, folder / IMAGE_DIR]

    def open(self, data_cfg) -> TaskSource:
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
            split_names = [names[i] for i in index]
            blocks = image_blocks(folder / IMAGE_DIR, split_names, data_cfg.image_size)
            splits[split] = SplitSource(labels=labels[index], read_blocks=blocks)

        spec = TaskSpec(
            dataset="celeba",
            task_names=tuple(attr_names),
            num_classes=(2,) * len(attr_names),
            mean=MEAN,
            std=STD,
            pad_crop=0,  # aligned faces: the alignment is information, shifting would blur it
            hflip=True,  # faces are left-right symmetric and no attribute names a side
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("celeba")(CelebATask())
