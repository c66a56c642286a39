"""Creating the ``Accelerator`` so that several processes work without a GPU too."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from mtl_cog.config.schema import DEFAULT_DIST_TIMEOUT_S
from mtl_cog.errors import ConfigError, UserError

# How a launcher tells each process the number of processes: torchrun, then the MPI launchers Accelerate
# reads on CPUs (Intel MPI / MPICH, Open MPI, MVAPICH); the same list as Accelerate's multi-CPU detection.
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def check_processes_connected() -> None:
    """Refuse a launch that asked for several CPU processes but started one that knows of no other.

    ``accelerate launch --cpu`` with ``--num_processes`` or ``--num_machines`` above 1 uses its
    simple launcher: without ``mpirun`` (``--mpirun_hostfile``) it starts one ordinary process per
    launch and only sets ``MASTER_ADDR``/``MASTER_PORT``. Each such process trains alone on all the
    data; on several machines the second one then finds the run folder in use, and the run is
    silently a one-process run. torchrun (no ``--cpu``) or mpirun tell each process the world size.
    """
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() != "true" or "MASTER_ADDR" not in os.environ:
        return
    if any(os.environ.get(name, "1") not in ("", "1") for name in WORLD_SIZE_VARIABLES):
        return
    raise UserError(
        "accelerate launch --cpu with several processes or machines started this process on its own: without "
        "mpirun (--mpirun_hostfile) Accelerate does not connect them, and each would train alone on all the data. "
        "Leave out --cpu: mtl-cog launch --config_file configs/accelerate/multi_process.yaml (add --num_machines N "
        "--machine_rank R --main_process_ip IP --main_process_port P for several machines) runs gloo on CPUs "
        "(docs/guides/cluster.md). One process: leave out --num_processes/--num_machines, or unset MASTER_ADDR."
    )


# bf16 autocast on a CPU is fast only where the CPU multiplies bf16 itself (AVX-512 BF16, AMX); elsewhere oneDNN
# emulates it. Measured with the benchmark's speed_options section (cog_cnn_tiny, batch 128, one thread): on an
# AVX-512 BF16 EPYC bf16 + channels_last was 1.70x (16 px) and 2.16x (32 px) *faster* than fp32; on an AVX2-only
# EPYC it was 0.12x and 0.11x, i.e. 8-9x *slower* (results/benchmarks/speed_options_avx2_*px.json).
BF16_WITHOUT_INSTRUCTIONS = ("warning: train.precision=bf16 on a CPU without AVX-512 BF16 or AMX: bf16 is emulated "
                             "there (measured 8-9x slower than fp32 for the tiny CNN); train.precision=no is faster "
                             "here (scripts/benchmark.py's speed_options section measures both).")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX-512 BF16 or AMX), where bf16 autocast can pay off."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


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
    check_processes_connected()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu_only_multiprocess = world_size > 1 and not torch.cuda.is_available()
    if precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError(
            "train.precision=fp16 needs a CUDA GPU (fp16 autocast with loss scaling); "
            "use train.precision=bf16 on the CPU, or train.precision=no."
        )
    if precision == "bf16" and not torch.cuda.is_available() and not cpu_has_native_bf16():
        print(BF16_WITHOUT_INSTRUCTIONS, file=sys.stderr)
    group = InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))
    # Accelerate passes on only the values that differ from its own defaults (to_kwargs), so a timeout equal
    # to its 600 s default would be dropped and torch's 30 min used instead: always pass the timeout.
    group.to_kwargs = lambda: {"timeout": group.timeout}
    return Accelerator(log_with=log_with, cpu=cpu_only_multiprocess, mixed_precision=precision,
                       kwargs_handlers=[group])
