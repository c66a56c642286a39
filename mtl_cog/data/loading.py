"""``load_task``: the registered data set a config names, through the decode-once cache.

Data sets register themselves in ``TASKS`` when their module is imported; ``TASKS`` imports the
built-in ``tasks`` package on its first lookup (``mtl_cog.registry``), so no caller imports it.
"""

from __future__ import annotations

from mtl_cog.config import DataConfig
from mtl_cog.data.cache import load_cached
from mtl_cog.data.task_api import TASKS, TaskData
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
    return task_data
