"""The prediction file format (``.npz``), so any model's outputs can be scored and calibrated.

Keys: ``task_names`` (T strings); for each task t, ``logits/<t>`` ((N,) for a binary task, (N, K)
for a K-class task) and ``labels/<t>`` ((N,) integers); optionally ``true_probs/<t>`` ((N,)
P(y=1|x) where the data set knows it, e.g. ``synthetic``).

``load_predictions`` trusts nothing in the file: it reads every array's ``.npy`` header first and
refuses one that claims more bytes than the archive stores for it, or more than the memory left
(a file of a few bytes can declare a terabyte array), as well as object arrays (pickles), files
with no task, duplicate task names, 0 samples, a (N, 1) "one-class" logit column, or arrays
that do not fit together. Every refusal names the file and the key.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
import psutil
import torch

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import LogitLayout
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


def labelled_rows(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One task's logits and labels without its unlabelled rows (label ``MISSING_LABEL``, partly labelled data).

    Prediction files keep every row (aligned across tasks, so multi-task metrics can pair them);
    every consumer that scores or fits one task takes its labelled rows through this function.
    """
    labels = np.asarray(labels)
    known = labels != MISSING_LABEL
    if known.all():
        return logits, labels
    return np.asarray(logits)[known], labels[known]


def require_labelled(task_names: list[str], labels: list[np.ndarray], where: str = "",
                     error: type[Exception] = PredictionFileError) -> None:
    """Refuse (``error``, its message prefixed by ``where``) a task with no labelled sample: every label
    ``MISSING_LABEL``, so there is nothing to score it on or fit its calibrator to. The one check behind
    loading a prediction file, scoring and every post-hoc fit."""
    for name, y in zip(task_names, labels):
        if not (np.asarray(y) != MISSING_LABEL).any():
            raise error(f"{where}task {name!r} has no labelled sample (every label is {MISSING_LABEL}): there is "
                        "nothing to score or fit it on. Label some samples of every task in every split.")


def labelled_only(predictions: Predictions, every_task: bool = False) -> Predictions:
    """``predictions`` without unlabelled rows: per task (ragged: each task keeps its own labelled rows), or,
    with ``every_task``, the rows labelled in every task (aligned, for what pairs tasks up: counts, joints).
    ``predictions`` itself when every label is known."""
    known = [np.asarray(y) != MISSING_LABEL for y in predictions.labels]
    if all(k.all() for k in known):
        return predictions
    if every_task:
        return select_rows(predictions, np.logical_and.reduce(known))
    return _take(predictions, known)


def select_rows(predictions: Predictions, rows: np.ndarray) -> Predictions:
    """The same ``rows`` (an (N,) bool mask or indices) of every task: still aligned across tasks."""
    return _take(predictions, [rows] * len(predictions.task_names))


def _take(predictions: Predictions, keep: list[np.ndarray]) -> Predictions:
    return Predictions(list(predictions.task_names), [np.asarray(z)[m] for z, m in zip(predictions.logits, keep)],
                       [np.asarray(y)[m] for y, m in zip(predictions.labels, keep)],
                       None if predictions.true_probs is None
                       else [np.asarray(p)[m] for p, m in zip(predictions.true_probs, keep)])


def layout_of(predictions: Predictions) -> LogitLayout:
    """The flat logit layout of per-task predictions (a binary task's (N,) logits: one column)."""
    return LogitLayout(tuple(2 if np.ndim(z) == 1 else z.shape[1] for z in predictions.logits))


def flat_tensors(predictions: Predictions, layout: LogitLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat float64 logits (N, L), labels (N, T)): what a calibrator of ``mtl_cog.models.calibrators`` is fitted on."""
    logits = torch.as_tensor(layout.join(predictions.logits), dtype=torch.float64)
    labels = torch.as_tensor(np.stack(predictions.labels, axis=1), dtype=torch.long)
    return logits, labels


def as_stored(predictions: Predictions) -> Predictions:
    """``predictions`` in the dtypes the file holds (float32 logits and p*, int64 labels): what a reader
    of the file gets, so a report made from memory shows the numbers a report made from the file would."""
    return Predictions(
        list(predictions.task_names),
        [np.ascontiguousarray(z, dtype=np.float32) for z in predictions.logits],
        [np.ascontiguousarray(y, dtype=np.int64) for y in predictions.labels],
        None if predictions.true_probs is None
        else [np.ascontiguousarray(p, dtype=np.float32) for p in predictions.true_probs],
    )


FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_float32_range(values: np.ndarray, what: str) -> None:
    """Refuse finite values that float32, the dtype logits are stored and scored in, cannot hold.

    ``astype(np.float32)`` turns 1e39 into inf without a word, after the finite check passed,
    and every metric of that task becomes NaN.
    """
    if values.dtype.itemsize > 4 and values.size and float(np.abs(values).max()) > FLOAT32_MAX:
        raise PredictionFileError(f"{what} exceed float32's range (largest |value| {float(np.abs(values).max()):.3g} "
                                  f"> {FLOAT32_MAX:.3g}); they would become infinite. Logits that large are not "
                                  "a network's output: check how the file was made.")


def save_predictions(path: str | Path, predictions: Predictions) -> None:
    for t, name in enumerate(predictions.task_names):  # before the cast to float32 would make them inf
        logits = np.asarray(predictions.logits[t])
        if not np.all(np.isfinite(logits)):  # a calibrator's NaN output: no reader could score the file
            raise PredictionFileError(f"{path}: task {name!r}: logits contain NaN or infinite values; nothing was "
                                      "written (the calibrator or network that produced them failed).")
        check_float32_range(logits, f"{path}: task {name!r}: logits")
    stored = as_stored(predictions)
    arrays: dict[str, np.ndarray] = {"task_names": np.array(stored.task_names, dtype=str)}
    for t, name in enumerate(stored.task_names):
        arrays[f"logits/{name}"] = stored.logits[t]
        arrays[f"labels/{name}"] = stored.labels[t]
        if stored.true_probs is not None:
            arrays[f"true_probs/{name}"] = stored.true_probs[t]

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
    check_declared_sizes(path)
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as err:  # noqa: BLE001  (zip/format errors come in many types)
        raise PredictionFileError(f"{path} is not a readable .npz file: {err}") from None
    with data:
        if "task_names" not in data.files:
            raise PredictionFileError(f"{path}: missing key 'task_names'.")
        task_names = _array(path, data, "task_names")
        if task_names.dtype.kind not in "US":
            raise PredictionFileError(f"{path}: 'task_names' must be strings, got dtype {task_names.dtype}.")
        names = [str(n) for n in task_names.reshape(-1)]
        if not names:
            raise PredictionFileError(f"{path}: 'task_names' is empty: the file holds no task to score.")
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise PredictionFileError(f"{path}: 'task_names' lists {twice} more than once; each task once, please.")
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
                p = _array(path, data, f"true_probs/{name}")
                if p.shape != z.shape or not np.issubdtype(p.dtype, np.number) or not np.all(np.isfinite(p)) \
                        or (p.size and not 0 <= p.min() <= p.max() <= 1):
                    raise PredictionFileError(f"{path}: 'true_probs/{name}' must be probabilities in [0, 1] shaped "
                                              f"like its logits {z.shape}; got {p.shape}, dtype {p.dtype}.")
                probs.append(p.astype(np.float32))
    lengths = {len(y) for y in labels}
    if len(lengths) > 1:
        raise PredictionFileError(f"{path}: tasks have different numbers of samples: {sorted(lengths)}.")
    return Predictions(names, logits, labels, probs if has_probs else None)


def check_declared_sizes(path: Path) -> None:
    """Refuse arrays whose ``.npy`` header declares more data than stored, or more than fits in memory.

    Reads only the zip directory and each member's header. A header may claim any shape: numpy
    would allocate it first and fail (or swap) before noticing the data is missing.
    """
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[:-4]
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                    else:
                        raise PredictionFileError(f"{path}: key {key!r}: unsupported .npy format version {version}.")
                    stored = info.file_size - member.tell()
                if dtype.hasobject:
                    raise PredictionFileError(f"{path}: key {key!r} holds Python objects (a pickle). Pickled objects "
                                              "are refused unread.")
                declared = prod(shape) * dtype.itemsize
                if declared > stored:
                    raise PredictionFileError(
                        f"{path}: key {key!r} declares a {shape} {dtype} array ({declared:,} bytes) but the file "
                        f"stores {max(stored, 0):,} bytes for it: the file is damaged or forged."
                    )
                total += declared
    except PredictionFileError:
        raise
    except Exception as err:  # noqa: BLE001  (zip and header errors come in many types)
        raise PredictionFileError(f"{path} is not a readable .npz file: {err}") from None
    available = psutil.virtual_memory().available
    if total > available:
        raise PredictionFileError(f"{path}: its arrays need {total / 2**30:.1f} GiB, more than the "
                                  f"{available / 2**30:.1f} GiB of memory available; refused unread.")


def _array(path: Path, data: np.lib.npyio.NpzFile, key: str) -> np.ndarray:
    try:
        return data[key]
    except ValueError as err:  # an object array: numpy refuses to unpickle it without allow_pickle
        raise PredictionFileError(f"{path}: key {key!r}: {err}. Pickled objects are refused unread.") from None
    except Exception as err:  # noqa: BLE001  (a damaged member: zlib, CRC, EOF errors)
        raise PredictionFileError(f"{path}: key {key!r} cannot be read ({type(err).__name__}: {err}).") from None


def _check_task(path: Path, name: str, z: np.ndarray, y: np.ndarray) -> None:
    if z.ndim not in (1, 2) or y.ndim != 1:
        raise PredictionFileError(
            f"{path}: task {name!r}: logits must be (N,) or (N, K) and labels (N,); got {z.shape} and {y.shape}."
        )
    if z.ndim == 2 and z.shape[1] < 2:
        raise PredictionFileError(
            f"{path}: task {name!r}: logits of shape {z.shape} describe a task with {z.shape[1]} class; a binary "
            "task is stored as (N,) logits of the positive class, a K-class task as (N, K) with K >= 2."
        )
    if len(z) == 0:
        raise PredictionFileError(f"{path}: task {name!r} has 0 samples: there is nothing to score.")
    if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
        raise PredictionFileError(f"{path}: task {name!r}: logits must be numbers, got dtype {z.dtype}.")
    if not np.issubdtype(y.dtype, np.integer):
        raise PredictionFileError(f"{path}: task {name!r}: labels must be integers, got dtype {y.dtype}.")
    if len(z) != len(y):
        raise PredictionFileError(f"{path}: task {name!r}: {len(z)} logits but {len(y)} labels.")
    if not np.all(np.isfinite(z)):
        raise PredictionFileError(f"{path}: task {name!r}: logits contain NaN or infinite values.")
    check_float32_range(z, f"{path}: task {name!r}: logits")
    num_classes = 2 if z.ndim == 1 else z.shape[1]
    known = y[y != MISSING_LABEL]  # partly labelled data keeps its unlabelled rows, marked MISSING_LABEL
    if len(known) and (known.min() < 0 or known.max() >= num_classes):
        raise PredictionFileError(
            f"{path}: task {name!r}: labels must be in [0, {num_classes - 1}] or {MISSING_LABEL} (missing); "
            f"got [{known.min()}, {known.max()}]."
        )
    require_labelled([name], [y], f"{path}: ")
