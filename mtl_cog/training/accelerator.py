"""Creating the ``Accelerator`` so that several processes work without a GPU too."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from mtl_cog.config.schema import DEFAULT_DIST_TIMEOUT_S
from mtl_cog.errors import ConfigError


def create_accelerator(log_with: list[str] | None = None, precision: str = "no",
                       timeout_s: int = DEFAULT_DIST_TIMEOUT_S) -> Accelerator:
    """An ``Accelerator`` that is really distributed whenever it was launched with several processes.

    Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly;
    otherwise ``accelerate launch --multi_gpu --num_processes 2`` or ``torchrun`` on a machine
    without a GPU starts two processes that each believe they are alone (each trains on all the
    data and writes the same files). We ask for it exactly in that case.

    ``precision`` (``train.precision``: no | bf16 | fp16) is Accelerate's mixed precision: the
    forward runs under autocast and, for fp16, the loss is scaled. The config is authoritative:
    it overrides ``accelerate launch --mixed_precision`` so that the saved config describes the run.

    ``timeout_s`` (``train.dist_timeout_s``) bounds every wait of one process for another: a
    collective whose peer is gone without closing its connection (a machine that lost power or
    network) raises gloo's/NCCL's timeout error after this long instead of waiting for ever.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu_only_multiprocess = world_size > 1 and not torch.cuda.is_available()
    if precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError(
            "train.precision=fp16 needs a CUDA GPU (fp16 autocast with loss scaling); "
            "use train.precision=bf16 on the CPU, or train.precision=no."
        )
    group = InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))
    # Accelerate passes on only the values that differ from its own defaults (to_kwargs), so a timeout equal
    # to its 600 s default would be dropped and torch's 30 min used instead: always pass the timeout.
    group.to_kwargs = lambda: {"timeout": group.timeout}
    return Accelerator(log_with=log_with, cpu=cpu_only_multiprocess, mixed_precision=precision,
                       kwargs_handlers=[group])
