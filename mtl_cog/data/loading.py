"""``load_task``: the registered data set a config names, through the decode-once cache.

Data sets register themselves in ``TASKS`` when their module is imported; ``TASKS`` imports the
built-in ``tasks`` package on its first lookup (``mtl_cog.registry``), so no caller imports it.
"""

from __future__ import annotations

import dataclasses

import torch

from mtl_cog.config import DataConfig
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.cache import load_cached
from mtl_cog.data.task_api import TASKS, TaskData, check_labels, too_few_training_images
from mtl_cog.errors import ConfigError, DataError, UnknownNameError


def load_task(data_cfg: DataConfig) -> TaskData:
    """The registered task named by ``data.task``, loaded with its splits (train/val/test).

    Goes through the uint8 cache (``mtl_cog.data.cache``) unless ``data.use_cache`` is false.
    ``data.max_samples`` keeps the first N samples of each split: a slice of the one full cache,
    or, without a cache, the only images decoded.
    """
    try:
        task = TASKS.get(data_cfg.task)
    except UnknownNameError as err:
        raise ConfigError(f"data.task: {err}") from None
    if data_cfg.use_cache:
        task_data = load_cached(task, data_cfg).head(data_cfg.max_samples)  # decode once, map afterwards
    else:
        task_data = task.open(data_cfg).decode(data_cfg.max_samples)
    for split in ("train", "val", "test"):
        if split not in task_data.splits or len(task_data.splits[split]) == 0:
            raise DataError(f"task {data_cfg.task!r} produced no {split!r} samples.")
    if data_cfg.train_size is not None:
        train = task_data.splits["train"]
        if data_cfg.train_size > len(train):
            raise ConfigError(too_few_training_images(data_cfg.train_size, len(train), data_cfg.task))
        task_data.splits["train"] = train.subset(data_cfg.train_size, data_cfg.train_size_seed)
    if not data_cfg.augment:  # the task's augmentation lives in its spec; batches read it from there
        task_data = TaskData(dataclasses.replace(task_data.spec, pad_crop=0, hflip=False), task_data.splits)
    if data_cfg.hide_labels > 0:
        task_data = hide_labels(task_data, data_cfg.hide_labels, data_cfg.hide_labels_seed)
    return task_data


def hide_labels(task_data: TaskData, fraction: float, seed: int) -> TaskData:
    """``task_data`` with each (sample, task) label of every split hidden (``MISSING_LABEL``) with probability
    ``fraction``, independently, from ``seed`` (one generator per split, so a split's mask does not depend on
    the others' sizes). Applied after the cache, so the cache is shared with the fully labelled data set;
    a task left with no label in a split is refused (``check_labels``) with the split named."""
    splits = {}
    for index, (name, split) in enumerate(sorted(task_data.splits.items())):
        generator = torch.Generator().manual_seed(seed * 1009 + index)
        hidden = torch.rand(split.labels.shape, generator=generator) < fraction
        labels = split.labels.masked_fill(hidden, MISSING_LABEL)
        check_labels(task_data.spec, labels.numpy(), f"data.hide_labels={fraction}: split {name!r}")
        splits[name] = dataclasses.replace(split, labels=labels)
    return dataclasses.replace(task_data, splits=splits)
