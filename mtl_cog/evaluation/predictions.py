"""The prediction file format (``.npz``), so any model's outputs can be scored and calibrated.

Keys: ``task_names`` (T strings); for each task t, ``logits/<t>`` ((N,) for a binary task, (N, K)
for a K-class task) and ``labels/<t>`` ((N,) integers); optionally ``true_probs/<t>`` ((N,)
P(y=1|x) where the data set knows it, e.g. ``synthetic``).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtl_cog.errors import PredictionFileError
from mtl_cog.io import atomic_write


@dataclass
class Predictions:
    task_names: list[str]
    logits: list[np.ndarray]
    labels: list[np.ndarray]
    true_probs: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.labels[0]) if self.labels else 0


def save_predictions(path: str | Path, predictions: Predictions) -> None:
    arrays: dict[str, np.ndarray] = {"task_names": np.array(predictions.task_names, dtype=str)}
    for t, name in enumerate(predictions.task_names):
        arrays[f"logits/{name}"] = np.asarray(predictions.logits[t], dtype=np.float32)
        arrays[f"labels/{name}"] = np.asarray(predictions.labels[t], dtype=np.int64)
        if predictions.true_probs is not None:
            arrays[f"true_probs/{name}"] = np.asarray(predictions.true_probs[t], dtype=np.float32)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file handle stops numpy from appending ".npz"
            np.savez(handle, **arrays)

    atomic_write(path, write)


def load_predictions(path: str | Path) -> Predictions:
    """Read and validate a prediction file; every problem names the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise PredictionFileError(f"prediction file not found: {path}")
    if not zipfile.is_zipfile(path):  # else numpy would take it for a pickle and suggest unpickling it
        raise PredictionFileError(f"{path} is not a readable .npz file (not a zip archive).")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as err:  # noqa: BLE001  (zip/format errors come in many types)
        raise PredictionFileError(f"{path} is not a readable .npz file: {err}") from None
    with data:
        if "task_names" not in data.files:
            raise PredictionFileError(f"{path}: missing key 'task_names'.")
        names = [str(n) for n in _array(path, data, "task_names").reshape(-1)]
        logits, labels, probs = [], [], []
        has_probs = all(f"true_probs/{n}" in data.files for n in names) and bool(names)
        for name in names:
            for prefix in ("logits", "labels"):
                if f"{prefix}/{name}" not in data.files:
                    raise PredictionFileError(f"{path}: missing key '{prefix}/{name}'.")
            z, y = _array(path, data, f"logits/{name}"), _array(path, data, f"labels/{name}")
            _check_task(path, name, z, y)
            logits.append(z.astype(np.float32))
            labels.append(y.astype(np.int64))
            if has_probs:
                probs.append(_array(path, data, f"true_probs/{name}").astype(np.float32))
    lengths = {len(y) for y in labels}
    if len(lengths) > 1:
        raise PredictionFileError(f"{path}: tasks have different numbers of samples: {sorted(lengths)}.")
    return Predictions(names, logits, labels, probs if has_probs else None)


def _array(path: Path, data: np.lib.npyio.NpzFile, key: str) -> np.ndarray:
    try:
        return data[key]
    except ValueError as err:  # an object array: numpy refuses to unpickle it without allow_pickle
        raise PredictionFileError(f"{path}: key {key!r}: {err}. Pickled objects are refused unread.") from None


def _check_task(path: Path, name: str, z: np.ndarray, y: np.ndarray) -> None:
    if z.ndim not in (1, 2) or y.ndim != 1:
        raise PredictionFileError(
            f"{path}: task {name!r}: logits must be (N,) or (N, K) and labels (N,); got {z.shape} and {y.shape}."
        )
    if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
        raise PredictionFileError(f"{path}: task {name!r}: logits must be numbers, got dtype {z.dtype}.")
    if not np.issubdtype(y.dtype, np.integer):
        raise PredictionFileError(f"{path}: task {name!r}: labels must be integers, got dtype {y.dtype}.")
    if len(z) != len(y):
        raise PredictionFileError(f"{path}: task {name!r}: {len(z)} logits but {len(y)} labels.")
    if not np.all(np.isfinite(z)):
        raise PredictionFileError(f"{path}: task {name!r}: logits contain NaN or infinite values.")
    num_classes = 2 if z.ndim == 1 else z.shape[1]
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise PredictionFileError(
            f"{path}: task {name!r}: labels must be in [0, {num_classes - 1}]; got [{y.min()}, {y.max()}]."
        )
