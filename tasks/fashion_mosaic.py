"""``fashion_mosaic``: 40 binary tasks about real photographs, CelebA's shape at CPU scale.

Each picture is a 2x2 mosaic of tiles (32x32 at the default ``data.image_size``: four 16x16
tiles). Each tile is empty (black, Fashion-MNIST's own background) with probability
``data.fashion_mosaic.empty_tile_probability`` (0.3) and otherwise holds one real Fashion-MNIST
item (Xiao et al. 2017, arXiv:1708.07747), shrunk from 28x28 to the tile with antialiased
bilinear resizing. Every label is a fact about the items placed (``mosaic_labels``): there is no
label noise of ours, but the classes stay as confusable as in Fashion-MNIST (shirt / T-shirt /
pullover / coat), so a task such as ``shirt_and_tshirt`` is hard, and every task that needs a
class inherits that ambiguity.

Why this shape (CelebA: 40 binary attributes, prevalence 2 %..83 %, correlated):

- prevalences spread from about 4 % (``top_above_trouser``) to about 73 % (``holds_top``)
  (docs/guides/data.md lists every task's, computed from the built data);
- the tasks depend on each other: the number of items varies (Binomial(4, 0.7)), a tile is empty
  or holds footwear or a top but never two of these (they exclude each other), ``holds_sneaker``
  implies ``holds_footwear``, the count tasks partition the pictures, and so on;
- several tasks are natural group variables (``holds_footwear``, ``holds_top``, ``holds_bag``,
  ``at_most_one_item``) for per-group calibration.

Splits follow the official split with no source image shared between them: training pictures
draw their items from the training part of ``fashion_mnist``'s stratified 80/20 split of the
official training set, validation pictures from its validation part, test pictures from the
official test set. Within a split the items are consumed from a fresh random permutation of its
pool, one permutation after another, so every source image is used about equally often.
Everything is fixed by ``data.fashion_mosaic.seed``.

``data.fashion_mosaic.heterogeneous=true`` makes it a heterogeneous multi-task problem: the four
binary ``tile_<p>_empty`` tasks become 11-class ``tile_<p>_item`` tasks (the Fashion-MNIST class
of the item in tile p, or 10 for an empty tile), beside the 36 binary ones. 40 tasks either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from mtl_cog.data.task_api import (
    TASKS,
    ReadBlocks,
    SplitSource,
    TaskSource,
    TaskSpec,
    block_ranges,
    capped_sizes,
    check_generation_memory,
)
from mtl_cog.errors import DataError
from tasks.cifar import resize_square
from tasks.fashion_mnist import locate, official_splits, read_official, source_files

TILES = ("top_left", "top_right", "bottom_left", "bottom_right")  # row-major: tile p at (p // 2, p % 2)
EMPTY = -1  # the class code of an empty tile in the layout's content matrix
# Fashion-MNIST class codes (tasks.fashion_mnist.CLASSES)
TSHIRT, TROUSER, PULLOVER, DRESS, COAT, SANDAL, SHIRT, SNEAKER, BAG, ANKLE_BOOT = range(10)
CLASS_SLUGS = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot")
FOOTWEAR = (SANDAL, SNEAKER, ANKLE_BOOT)
TOPS = (TSHIRT, PULLOVER, COAT, SHIRT)  # upper-body garments (a dress is not one)
SPLIT_CODE = {"train": 0, "val": 1, "test": 2}  # the second word of each split's random stream


@dataclass(frozen=True)
class Layout:
    """What the pictures of one split hold: per tile, the class (or ``EMPTY``) and the source item (or -1)."""

    content: np.ndarray  # (N, 4) int64 class code per tile, EMPTY where empty
    items: np.ndarray  # (N, 4) int64 index into the split's pool of source images, -1 where empty


def draw_layout(pool_labels: np.ndarray, n: int, empty_probability: float, rng: np.random.Generator) -> Layout:
    """``n`` pictures: occupancy per tile ~ Bernoulli(1 - p_empty), items from consecutive permutations of the pool."""
    occupied = rng.random((n, len(TILES))) >= empty_probability
    slots = int(occupied.sum())
    rounds = -(-slots // len(pool_labels)) if slots else 0
    order = np.concatenate([rng.permutation(len(pool_labels)) for _ in range(rounds)] or [np.zeros(0, np.int64)])
    items = np.full((n, len(TILES)), -1, dtype=np.int64)
    items[occupied] = order[:slots]  # row-major: picture by picture, tile by tile
    content = np.where(occupied, pool_labels[np.maximum(items, 0)], EMPTY).astype(np.int64)
    return Layout(content, items)


# ------------------------------------------------------------------------------------- the labels


def _has(content: np.ndarray, classes) -> np.ndarray:
    """(N, 4) bool: the tile holds an item of one of ``classes``."""
    return np.isin(content, classes)


def _binary_tasks() -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    """The 40 binary tasks as (name, content -> (N,) bool), in the data set's order."""
    tasks: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = []
    for p, tile in enumerate(TILES):
        tasks.append((f"tile_{tile}_empty", lambda c, p=p: c[:, p] == EMPTY))
    for p, tile in enumerate(TILES):
        tasks.append((f"tile_{tile}_footwear", lambda c, p=p: _has(c[:, p], FOOTWEAR)))
    for p, tile in enumerate(TILES):
        tasks.append((f"tile_{tile}_top", lambda c, p=p: _has(c[:, p], TOPS)))
    for k, slug in enumerate(CLASS_SLUGS):
        tasks.append((f"holds_{slug}", lambda c, k=k: (c == k).any(axis=1)))

    def count(c: np.ndarray, classes=None) -> np.ndarray:
        return ((c != EMPTY) if classes is None else _has(c, classes)).sum(axis=1)

    def holds(c: np.ndarray, k: int) -> np.ndarray:
        return (c == k).any(axis=1)

    def same_class_twice(c: np.ndarray) -> np.ndarray:
        per_class = np.stack([(c == k).sum(axis=1) for k in range(10)], axis=1)
        return per_class.max(axis=1) >= 2

    def top_above_trouser(c: np.ndarray) -> np.ndarray:
        # a top in a top-row tile directly above trousers: a worn-outfit arrangement
        return (_has(c[:, 0], TOPS) & (c[:, 2] == TROUSER)) | (_has(c[:, 1], TOPS) & (c[:, 3] == TROUSER))

    tasks += [
        ("holds_footwear", lambda c: count(c, FOOTWEAR) >= 1),
        ("holds_top", lambda c: count(c, TOPS) >= 1),
        ("at_most_one_item", lambda c: count(c) <= 1),
        ("exactly_two_items", lambda c: count(c) == 2),
        ("three_or_more_items", lambda c: count(c) >= 3),
        ("all_tiles_full", lambda c: count(c) == 4),
        ("at_least_two_tops", lambda c: count(c, TOPS) >= 2),
        ("pair_of_footwear", lambda c: count(c, FOOTWEAR) >= 2),
        ("same_class_twice", same_class_twice),
        ("only_footwear", lambda c: (count(c) >= 1) & (count(c) == count(c, FOOTWEAR))),
        ("shirt_and_tshirt", lambda c: holds(c, SHIRT) & holds(c, TSHIRT)),
        ("coat_and_pullover", lambda c: holds(c, COAT) & holds(c, PULLOVER)),
        ("outfit", lambda c: (count(c, TOPS) >= 1) & holds(c, TROUSER) & (count(c, FOOTWEAR) >= 1)),
        ("dress_and_bag", lambda c: holds(c, DRESS) & holds(c, BAG)),
        ("bag_and_footwear", lambda c: holds(c, BAG) & (count(c, FOOTWEAR) >= 1)),
        ("top_above_trouser", top_above_trouser),
        ("footwear_in_bottom_row", lambda c: _has(c[:, 2:], FOOTWEAR).any(axis=1)),
        ("top_row_empty", lambda c: (c[:, :2] == EMPTY).all(axis=1)),
    ]
    return tasks


BINARY_TASKS = _binary_tasks()
TASK_NAMES = tuple(name for name, _ in BINARY_TASKS)
ITEM_CLASSES = 11  # heterogeneous tile tasks: the 10 Fashion-MNIST classes, then 10 = empty


def task_names_and_classes(heterogeneous: bool) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Task names and class counts; heterogeneous: each ``tile_<p>_empty`` becomes an 11-class ``tile_<p>_item``."""
    names, classes = [], []
    for name in TASK_NAMES:
        if heterogeneous and name.endswith("_empty") and name.startswith("tile_"):
            names.append(name.replace("_empty", "_item"))
            classes.append(ITEM_CLASSES)
        else:
            names.append(name)
            classes.append(2)
    return tuple(names), tuple(classes)


def mosaic_labels(content: np.ndarray, heterogeneous: bool = False) -> np.ndarray:
    """The (N, 40) int64 label matrix of pictures whose tiles hold ``content`` (class codes, ``EMPTY``).

    The one place where labels are made: every label is a fact about the items placed.
    """
    columns = []
    for name, rule in BINARY_TASKS:
        if heterogeneous and name.startswith("tile_") and name.endswith("_empty"):
            tile = content[:, TILES.index(name[len("tile_"):-len("_empty")])]
            columns.append(np.where(tile == EMPTY, ITEM_CLASSES - 1, tile))
        else:
            columns.append(rule(content).astype(np.int64))
    return np.stack(columns, axis=1).astype(np.int64) if columns else np.zeros((len(content), 0), np.int64)


# ------------------------------------------------------------------------------------ the pictures


def tile_images(pool: np.ndarray, image_size: int) -> np.ndarray:
    """(M, 28, 28) source items -> (M, t, t) tiles, t = image_size // 2 (antialiased bilinear)."""
    tile = image_size // 2
    return resize_square(torch.from_numpy(np.ascontiguousarray(pool[:, None])), tile)[:, 0].numpy()


def render(tiles: np.ndarray, layout: Layout, start: int, end: int, image_size: int) -> np.ndarray:
    """Pictures ``start:end`` as (n, 3, S, S) uint8 (an odd S: rendered at S - 1, then resized)."""
    t = tiles.shape[-1]
    pictures = np.zeros((end - start, 2 * t, 2 * t), dtype=np.uint8)
    items = layout.items[start:end]
    for p in range(len(TILES)):
        rows, (r, c) = np.flatnonzero(items[:, p] >= 0), divmod(p, 2)
        pictures[rows, r * t : (r + 1) * t, c * t : (c + 1) * t] = tiles[items[rows, p]]
    rgb = np.ascontiguousarray(np.broadcast_to(pictures[:, None], (len(pictures), 3, 2 * t, 2 * t)))
    return rgb if 2 * t == image_size else resize_square(torch.from_numpy(rgb), image_size).numpy()


def picture_blocks(tiles: np.ndarray, layout: Layout, image_size: int) -> ReadBlocks:
    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        for start, end in block_ranges(min(stop, len(layout.items)), image_size):
            yield render(tiles, layout, start, end, image_size)

    return read_blocks


def picture_statistics(tiles: np.ndarray, layout: Layout) -> tuple[float, float]:
    """Exact mean and std (on [0, 1]) of all pixels of the pictures, from per-tile sums (nothing rendered)."""
    values = tiles.reshape(len(tiles), -1).astype(np.float64) / 255.0
    sums, squares = values.sum(axis=1), (values**2).sum(axis=1)
    used = layout.items[layout.items >= 0]
    pixels = layout.items.size * values.shape[1]  # four tiles per picture, empty ones are zeros
    if not pixels:
        return 0.5, 0.25
    mean = sums[used].sum() / pixels
    return float(mean), float(np.sqrt(max(squares[used].sum() / pixels - mean**2, 1e-12)))


def split_sizes_of(cfg) -> dict[str, int]:
    return {"train": cfg.train_size, "val": cfg.val_size, "test": cfg.test_size}


# Bytes a picture's layout and labels hold while a split is drawn: four tiles' random draw, class,
# item and their copies (int64 or float64, about six arrays of four) and 40 int64 labels with the
# task functions' intermediates (about twice that).
BYTES_PER_PICTURE = 6 * len(TILES) * 8 + 2 * 40 * 8


def check_sources(pools: dict[str, tuple[np.ndarray, np.ndarray]], files: str) -> None:
    """A split's pictures draw their items from its pool: an empty pool (a source file of 0 items) has none."""
    empty = [split for split, (_, labels) in pools.items() if len(labels) == 0]
    if empty:
        raise DataError(f"fashion_mosaic: the source pool of the {', '.join(empty)} split holds no Fashion-MNIST "
                        f"item (read from {files}); its pictures have nothing to show. Use the complete official "
                        "files.")


class FashionMosaicTask:
    def split_sizes(self, data_cfg) -> dict[str, int]:
        return capped_sizes(split_sizes_of(data_cfg.fashion_mosaic), data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return len(TASK_NAMES)

    def source_files(self, data_cfg) -> list:
        return source_files(data_cfg)

    def open(self, data_cfg) -> TaskSource:
        cfg = data_cfg.fashion_mosaic
        check_generation_memory(sum(split_sizes_of(cfg).values()), BYTES_PER_PICTURE, data_cfg.image_size,
                                data_cfg.use_cache, "data.fashion_mosaic")  # before reading or drawing anything
        folder = locate(data_cfg)
        pools = official_splits(read_official(folder))
        check_sources(pools, str(folder))
        splits, stats = {}, None
        for split, n in split_sizes_of(cfg).items():
            images, labels = pools[split]
            rng = np.random.default_rng([cfg.seed, SPLIT_CODE[split]])
            layout = draw_layout(labels, n, cfg.empty_tile_probability, rng)
            tiles = tile_images(images, data_cfg.image_size)
            if split == "train":
                stats = picture_statistics(tiles, layout)
            splits[split] = SplitSource(labels=mosaic_labels(layout.content, cfg.heterogeneous),
                                        read_blocks=picture_blocks(tiles, layout, data_cfg.image_size))
        names, classes = task_names_and_classes(cfg.heterogeneous)
        mean, std = stats
        spec = TaskSpec(
            dataset="fashion_mosaic",
            task_names=names,
            num_classes=classes,
            mean=(mean,) * 3,
            std=(std,) * 3,
            pad_crop=0,  # a shift moves items across tile borders, and the tile tasks name positions
            hflip=False,  # a flip swaps left and right tiles, which the tile tasks tell apart
        )
        return TaskSource(spec, data_cfg.image_size, splits)


TASKS.register("fashion_mosaic")(FashionMosaicTask())
