"""The resumable training state: one safetensors file, written atomically, loaded without pickle.

``training_state.safetensors`` in the run folder holds every tensor needed to continue a run
(model weights and buffers, the optimiser's per-parameter state for both parameter groups, the
torch CPU/CUDA and numpy RNG states) and, in the file's string metadata, JSON for the rest (the
optimiser's parameter groups and scalar state, the scheduler, Python's RNG state, and the
``Progress``: epoch, step, best-so-far validation value and epoch, and how many lines of
``metrics.jsonl`` belong to that moment). One file renamed into place is the commit point: a
kill at any moment leaves either the previous state or the new one. This is what Accelerate's
``save_state``/``load_state`` do, but that writes the optimiser with ``torch.save`` (a pickle);
here everything is tensors or JSON, so loading a run folder can never execute code.

Write order at the end of epoch e (``mtl_cog.training.loop.run_stage``): the ``metrics.jsonl`` line, then
this state, then (if e is the best epoch) ``best_model.safetensors``. ``restore_run`` repairs the
two gaps a kill can leave: lines after the saved count are dropped (that epoch is redone), and
a best model that missed its write is rebuilt from the state's weights (the model evaluated at
the end of epoch e is exactly the one saved in the state of that moment). ``metrics.jsonl`` is
appended to (``mtl_cog.io.append_jsonl``); a kill in the middle of an append leaves a partial
last line, which is beyond the saved count and therefore cut too.

A state is checked before it is used: its progress must be possible (epoch >= 1, counts >= 0,
best epoch before the next epoch), every optimiser tensor must have its parameter's shape, and
no tensor may hold NaN/inf. A damaged state is refused with a ``CheckpointError`` naming the file,
instead of failing at the first step or training from nonsense.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mtl_cog.errors import CheckpointError
from mtl_cog.io import atomic_write
from mtl_cog.runs import rundir
from mtl_cog.runs.checkpoint import check_finite, load_weights, read_metadata, save_model

FORMAT = rundir.STATE_FORMAT


@dataclass
class EpochProgress:
    """How far the current epoch got: enough to continue it after a crash."""

    step: int = 0  # batches done (trained or skipped)
    loss_sums: list[float] = field(default_factory=list)  # per process: sum of its losses so far
    trained: int = 0  # steps with an optimiser update
    skipped: int = 0  # batches dropped because their loss was not finite (train.nonfinite=skip)
    # mtl.aggregator: the backbone's task weights summed over the epoch's trained steps so far (float64, the
    # same on every process), so a resumed epoch logs the mean over all its steps; empty without one (and
    # in states saved before the sums were kept, whose resumed epoch logs the mean since the resume)
    weight_sums: list[float] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)  # mtl.aggregator: [steps checked, steps in conflict] so far


@dataclass
class Progress:
    """Where training stands. ``epoch`` is the epoch to run (or continue) next."""

    epoch: int = 1
    within: EpochProgress = field(default_factory=EpochProgress)
    best: float | None = None  # best validation value of eval.selection_metric so far
    best_epoch: int = 0
    metrics_lines: int = 0  # lines of metrics.jsonl written up to this state

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Progress:
        progress = cls(**{**raw, "within": EpochProgress(**raw["within"])})
        progress.check()
        return progress

    def check(self) -> None:
        """Raise ``ValueError`` naming the first impossible value (a damaged or hand-edited state)."""
        counts = {"epoch": self.epoch, "best_epoch": self.best_epoch, "metrics_lines": self.metrics_lines,
                  "within.step": self.within.step, "within.trained": self.within.trained,
                  "within.skipped": self.within.skipped}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "epoch" else 0):
                raise ValueError(f"progress {name} = {value!r} is impossible")
        if self.best_epoch >= self.epoch:
            raise ValueError(f"progress best_epoch = {self.best_epoch} is not before the next epoch {self.epoch}")
        if self.best is not None and (isinstance(self.best, bool) or not isinstance(self.best, (int, float))):
            raise ValueError(f"progress best = {self.best!r} is not a number")
        for name in ("loss_sums", "weight_sums", "conflicts"):
            values = getattr(self.within, name)
            if not isinstance(values, list) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise ValueError(f"progress within.{name} = {values!r} is not a list of numbers")


# ---------------------------------------------------------------------------------------- save


def save_training_state(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    progress: Progress,
    objective: torch.nn.Module | None = None,
) -> None:
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    if objective is not None:  # a loss with parameters or running statistics (FedLAS's gate and norms)
        tensors.update({f"objective/{k}": v for k, v in objective.state_dict().items()})
    optim_state = optimizer.state_dict()
    scalar_state: dict[str, dict[str, Any]] = {}
    for index, values in optim_state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{index}/{key}"] = value
            else:
                scalar_state.setdefault(str(index), {})[key] = value
    rng, rng_tensors = _rng_state()
    tensors.update(rng_tensors)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    metadata = {
        "format": FORMAT,
        "progress": json.dumps(dataclasses.asdict(progress)),
        "optimizer_groups": json.dumps(optim_state["param_groups"]),
        "optimizer_scalars": json.dumps(scalar_state),
        "scheduler": json.dumps(scheduler.state_dict()),
        "rng": json.dumps(rng),
    }
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    version, mt_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors = {"rng/torch": torch.get_rng_state(), "rng/numpy_keys": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = state
    meta = {"python": [version, list(mt_state), gauss], "numpy": [kind, int(pos), int(has_gauss), float(cached)]}
    return meta, tensors


# ---------------------------------------------------------------------------------------- load


def load_training_state(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    objective: torch.nn.Module | None = None,
) -> Progress:
    """Restore model, optimiser, scheduler, RNG (and the loss's own) states from ``path``; return the progress."""
    tensors, metadata = _read(path)
    try:
        if metadata.get("format") != FORMAT:
            raise KeyError(f"format {metadata.get('format')!r}, expected {FORMAT!r}")
        model_state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        load_weights(path, model, model_state)
        objective_state = {k[len("objective/"):]: v for k, v in tensors.items() if k.startswith("objective/")}
        if objective is not None and (objective_state or objective.state_dict()):
            try:
                objective.load_state_dict(objective_state)
            except RuntimeError as err:
                raise CheckpointError(f"{path}: the loss's saved state does not fit this run's loss "
                                      f"(was method.loss changed?): {err}") from None
        state: dict[int, dict[str, Any]] = {}
        for name, value in tensors.items():
            if name.startswith("optimizer/"):
                _, index, key = name.split("/", 2)
                state.setdefault(int(index), {})[key] = value
        for index, values in json.loads(metadata["optimizer_scalars"]).items():
            state.setdefault(int(index), {}).update(values)
        groups = json.loads(metadata["optimizer_groups"])
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
            raise CheckpointError(
                f"{path}: its optimiser groups ({[g.get('name') for g in groups]}, sizes "
                f"{[len(g['params']) for g in groups]}) do not match this run's "
                f"({[len(g['params']) for g in optimizer.param_groups]}): was the method changed?"
            )
        _check_optimizer_state(path, state, groups, optimizer)
        check_finite(path, {k: v for k, v in tensors.items() if k.startswith("optimizer/")})
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        scheduler.load_state_dict(json.loads(metadata["scheduler"]))
        _set_rng_state(json.loads(metadata["rng"]), tensors)
        return Progress.from_dict(json.loads(metadata["progress"]))
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise _unusable(path, err) from None


def _unreadable(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"{path} is not a valid safetensors file ({err}). It was refused unread: mtl_cog only "
                           "loads safetensors, never pickles. Delete it to restart this run from its last intact "
                           "state.")


def _unusable(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"{path} is not a usable mtl_cog training state ({err}). Delete it to restart "
                           "the run from the beginning, or resume from an intact copy.")


def read_progress(path: Path) -> Progress | None:
    """The progress saved in a training state, read without loading a tensor or changing a file (None: no
    state yet): what ``--resume`` checks its changed settings against before anything is written."""
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise _unreadable(path, err) from None
    try:
        if metadata.get("format") != FORMAT:
            raise KeyError(f"format {metadata.get('format')!r}, expected {FORMAT!r}")
        return Progress.from_dict(json.loads(metadata["progress"]))
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise _unusable(path, err) from None


def _check_optimizer_state(path: Path, state: dict[int, dict[str, Any]], groups: list[dict[str, Any]],
                           optimizer: torch.optim.Optimizer) -> None:
    """Every saved per-parameter tensor (Adam's moments) must have its parameter's shape.

    ``torch.optim.Optimizer.load_state_dict`` does not check this; a wrong shape would only fail
    (or broadcast silently) at the first step after resuming.
    """
    ids = [index for group in groups for index in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    by_id = dict(zip(ids, params))
    for index, values in state.items():
        if index not in by_id:
            raise CheckpointError(f"{path}: optimiser state for parameter {index}, which no parameter group "
                                  "lists; the file is damaged.")
        shape = tuple(by_id[index].shape)
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0 and tuple(value.shape) != shape:
                raise CheckpointError(
                    f"{path}: optimiser state {key!r} of parameter {index} has shape {tuple(value.shape)}, but the "
                    f"parameter has shape {shape}; the file is damaged or belongs to another model."
                )


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; anything else (a pickle, a truncated file) is refused unread."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: cut short
        raise _unreadable(path, err) from None
    return tensors, metadata


def _check_rng_tensor(name: str, value: torch.Tensor, like: torch.Tensor) -> None:
    """A saved generator state must have the dtype and size of a live one: torch's setters raise a
    bare RuntimeError on anything else, and numpy would silently wrap out-of-range keys."""
    if value.dtype != like.dtype or value.shape != like.shape:
        raise ValueError(f"RNG state {name!r} is {value.dtype} {tuple(value.shape)}, a generator state is "
                         f"{like.dtype} {tuple(like.shape)}")


def _set_rng_state(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, mt_state, gauss = meta["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, pos, has_gauss, cached = meta["numpy"]
    keys = tensors["rng/numpy_keys"]
    _check_rng_tensor("rng/numpy_keys", keys, torch.zeros(624, dtype=torch.int64))
    if int(keys.min()) < 0 or int(keys.max()) > np.iinfo(np.uint32).max:
        raise ValueError("RNG state 'rng/numpy_keys' holds values outside numpy's uint32 keys")
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    _check_rng_tensor("rng/torch", tensors["rng/torch"], torch.get_rng_state())
    try:
        torch.set_rng_state(tensors["rng/torch"])
    except RuntimeError as err:  # right size, damaged content: "Invalid mt19937 state"
        raise ValueError(f"RNG state 'rng/torch' is damaged ({err})") from None
    cuda = [tensors[f"rng/cuda/{i}"] for i in range(len([k for k in tensors if k.startswith("rng/cuda/")]))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        for i, (value, live) in enumerate(zip(cuda, torch.cuda.get_rng_state_all())):
            _check_rng_tensor(f"rng/cuda/{i}", value, live)
        torch.cuda.set_rng_state_all(cuda)  # a different GPU count: keep the fresh states


# ------------------------------------------------------------------------------------ run folder


@dataclass(frozen=True)
class StageFiles:
    """The files of one training stage: its resumable state, its metrics lines, its best checkpoint."""

    state: Path
    metrics: Path
    best_model: Path

    @classmethod
    def stage_one(cls, run_dir: Path) -> StageFiles:
        return cls(run_dir / rundir.STATE, run_dir / rundir.METRICS, run_dir / rundir.BEST_MODEL)


def restore_run(
    files: StageFiles | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    is_main_process: bool = True,
    objective: torch.nn.Module | None = None,
) -> Progress:
    """Load a stage's last state (a fresh ``Progress`` if it has none) and make its files agree with it.

    ``files`` is a stage's ``StageFiles``, or a run folder (stage one's files). Every process
    loads the state; only the main process repairs files.
    """
    if not isinstance(files, StageFiles):
        files = StageFiles.stage_one(Path(files))
    path = files.state
    progress = load_training_state(path, model, optimizer, scheduler, objective) if path.exists() else Progress()
    if is_main_process:
        _truncate_lines(files.metrics, progress.metrics_lines)
        best_path = files.best_model
        best_epoch_on_disk = read_metadata(best_path).get("epoch") if best_path.exists() else None
        if progress.best_epoch and best_epoch_on_disk != str(progress.best_epoch):
            if progress.best_epoch != progress.epoch - 1 or progress.within.step:
                raise CheckpointError(
                    f"{best_path} holds epoch {best_epoch_on_disk} but {path} says the best epoch is "
                    f"{progress.best_epoch}: the run folder was changed by hand and cannot be resumed."
                )
            # killed between writing the state and the best model: the state's weights are that model
            save_model(best_path, model, metadata={"epoch": str(progress.best_epoch)})
    return progress


def _truncate_lines(path: Path, keep: int) -> None:
    """Cut ``path`` back to its first ``keep`` complete lines (drops a partial line a kill left)."""
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    complete = [line for line in lines if line.endswith(b"\n")]
    if len(complete) < keep:
        raise CheckpointError(
            f"{path} has {len(complete)} complete lines, but the training state was saved after line {keep}: the "
            "file was cut or edited, and the resumed run would miss epochs. Restore it, or start the run over."
        )
    if len(lines) != keep:
        atomic_write(path, lambda tmp: tmp.write_bytes(b"".join(lines[:keep])))
        _line_counts.pop(path, None)


# path -> (inode, bytes counted, newlines in them): lets count_lines read only what was appended
_line_counts: dict[Path, tuple[int, int, int]] = {}


def count_lines(path: Path) -> int:
    """Complete lines (newlines) in ``path``; O(appended bytes) per call, not O(file).

    Called at every saved state; the file only grows by appends in between (a rewrite by
    ``_truncate_lines`` makes a new file, a new inode, which starts the count over).
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        return 0
    inode, counted, count = _line_counts.get(path, (None, 0, 0))
    if inode != stat.st_ino or counted > stat.st_size:
        counted, count = 0, 0
    with open(path, "rb") as handle:
        handle.seek(counted)
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            count += chunk.count(b"\n")
            counted += len(chunk)
    _line_counts[path] = (stat.st_ino, counted, count)
    return count
