"""``task_spec.json``: the data set's ``TaskSpec`` saved beside a run, so a trained run predicts without data."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mtl_cog.data.task_api import TaskSpec
from mtl_cog.errors import DataError, RunFolderError
from mtl_cog.io import atomic_write_json


def save_task_spec(spec: TaskSpec, path: Path) -> None:
    atomic_write_json(path, dataclasses.asdict(spec))


def load_task_spec(path: Path) -> TaskSpec:
    """The spec saved by ``save_task_spec``; a damaged file is a ``RunFolderError`` naming it."""
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):  # [] or null parse, but are no spec
            raise TypeError(f"expected a JSON object, got {type(raw).__name__}")
        return TaskSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
    except (OSError, ValueError, TypeError, DataError) as err:  # DataError: TaskSpec's own type/range checks
        raise RunFolderError(f"{path} is not a valid task spec ({err}); retrain the run, or restore the file "
                             "from a copy of the run folder.") from None
