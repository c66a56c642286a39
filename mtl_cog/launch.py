"""Creating the ``Accelerator`` so that several processes work without a GPU too."""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator


def create_accelerator(log_with: list[str] | None = None) -> Accelerator:
    """An ``Accelerator`` that is really distributed whenever it was launched with several processes.

    Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly;
    otherwise ``accelerate launch --multi_gpu --num_processes 2`` or ``torchrun`` on a machine
    without a GPU starts two processes that each believe they are alone (each trains on all the
    data and writes the same files). We ask for it exactly in that case.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu_only_multiprocess = world_size > 1 and not torch.cuda.is_available()
    return Accelerator(log_with=log_with, cpu=cpu_only_multiprocess)
