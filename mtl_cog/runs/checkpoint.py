"""Model checkpoints as safetensors: tensors only, so loading never runs code.

Loading refuses a checkpoint that does not fit the model (names, shapes) or holds NaN/inf values:
training never writes such weights (a non-finite loss stops the run or skips the batch before any
update), so they mean a damaged or foreign file, and a network built from them would only
produce NaN predictions that every metric then averages. The same holds for values outside the
range that makes the network well-defined: a normalisation layer's running variance is a mean of
squares, never negative (its square root divides every activation), and its batch count is a count.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from mtl_cog.errors import CheckpointError
from mtl_cog.io import atomic_write


def save_model(path: str | Path, model: torch.nn.Module, metadata: dict[str, str] | None = None) -> None:
    """Weights and buffers as safetensors (atomic); ``metadata`` is stored in the file's header."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a safetensors file (header only; never unpickles anything)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return handle.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: cut short
        raise CheckpointError(
            f"{path} is not a valid safetensors checkpoint ({err}). It was refused unread: "
            "mtl_cog only loads safetensors, never pickles."
        ) from None


def load_model(path: str | Path, model: torch.nn.Module) -> None:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: cut short
        raise CheckpointError(
            f"{path} is not a valid safetensors checkpoint ({err}). It was refused unread: "
            "mtl_cog only loads safetensors, never pickles."
        ) from None
    load_weights(path, model, state)


def load_weights(path: str | Path, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``model.load_state_dict(state)``, with a mismatch (names or shapes) reported as a ``CheckpointError``."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    reshaped = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
                if k in state and state[k].shape != v.shape]
    if missing or unexpected or reshaped:
        raise CheckpointError(
            f"{path} does not match the model of this config: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"other shape (saved vs model) {reshaped[:5]}. Was the config (backbone, head, tasks) changed?"
        )
    # load_state_dict casts silently: int8 weights of the right shapes would load as rounded floats.
    # Training saves each tensor in its parameter's dtype, so any other dtype is a foreign file.
    retyped = [f"{k} {state[k].dtype} vs {v.dtype}" for k, v in own.items() if state[k].dtype != v.dtype]
    if retyped:
        raise CheckpointError(
            f"{path} holds tensors of another dtype than the model's (saved vs model: {', '.join(retyped[:5])}); "
            "training never writes such a file. Retrain, or restore the run folder from a copy."
        )
    check_finite(path, state)
    check_ranges(path, model, state)
    model.load_state_dict(state)


def check_finite(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse floating-point tensors holding NaN or inf (see the module docstring)."""
    bad = [name for name, value in tensors.items()
           if value.is_floating_point() and not bool(torch.isfinite(value).all())]
    if bad:
        raise CheckpointError(
            f"{path} holds NaN or infinite values in {len(bad)} tensor(s) ({', '.join(bad[:5])}); it is damaged "
            "and was not loaded. Retrain, or resume from an intact copy of the run folder."
        )


def check_ranges(path: str | Path, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse running statistics no training writes: a negative variance (NaN after its square root) or a
    negative batch count, in every normalisation layer that keeps them (BatchNorm, InstanceNorm with
    running statistics)."""
    bad = []
    for prefix, module in model.named_modules():
        if not isinstance(getattr(module, "running_var", None), torch.Tensor):  # keeps no running statistics
            continue
        dot = f"{prefix}." if prefix else ""
        variance, count = tensors.get(f"{dot}running_var"), tensors.get(f"{dot}num_batches_tracked")
        if variance is not None and bool((variance < 0).any()):
            bad.append(f"{dot}running_var holds {int((variance < 0).sum())} negative value(s)")
        if count is not None and bool((count < 0).any()):
            bad.append(f"{dot}num_batches_tracked is negative")
    if bad:
        raise CheckpointError(
            f"{path} holds values no training writes ({'; '.join(bad[:3])}): a network built from it would "
            "predict NaN. It is damaged or foreign and was not loaded. Retrain, or restore the run folder from a copy."
        )
