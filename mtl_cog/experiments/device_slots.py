"""Which accelerator a run starts on when several runs share one (``--runs-per-device K``), and which run waits.

At the paper's 32 px one run keeps a large accelerator mostly idle (docs/guides/benchmarks.md), so the
local launcher can place up to K runs on each device (or group of ``--gpus-per-run`` devices), each its
own process with its own ``CUDA_VISIBLE_DEVICES``. A run starts only where it fits:

- at most K runs on a device; a new run goes to the device with the fewest runs (the lowest index on a
  tie), so 8 runs on 2 devices at K = 4 fill both evenly;
- a memory check before it starts: the device's free memory (``nvidia-smi``, read by the driver
  process, which never opens a CUDA context of its own) less what the runs started there in the last
  ``settle_seconds`` may still allocate must hold the run's need. The need is
  ``--device-memory-per-run``, else an equal share of the device less 10 % (``total / K * 0.9``: the
  CUDA contexts and the allocator's slack); with K = 1 and no stated need there is no check (one run per
  device, as before). A run that does not fit **waits** until one ends or the memory frees; nothing is
  ever stopped to make room. A need larger than a whole device is refused before anything starts.

Without ``nvidia-smi`` (or when it fails) the check has no numbers: the K limit alone applies, and the
first wait line says so. The probe is a parameter, so the scheduling is tested with a fake device
(tests/test_runs_per_device.py) on a machine with no accelerator.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mtl_cog.errors import UserError

SETTLE_SECONDS = 60.0  # a GPU-scale run's start (imports, data, model, first steps: gpu_time.START_SECONDS = 30) x2
SHARE_MARGIN = 0.9  # of an equal share, when no need is stated: the contexts and the allocator's slack
GIB = 2**30


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes
    total: int


MemoryProbe = Callable[[str], "DeviceMemory | None"]  # one device id (as CUDA_VISIBLE_DEVICES names it) -> its memory


def nvidia_smi_probe(device: str) -> DeviceMemory | None:
    """Free and total memory of one GPU from ``nvidia-smi`` (MiB), or None when it cannot tell."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits",
                              "-i", device], capture_output=True, text=True, timeout=20)
        values = [float(v) for v in out.stdout.strip().splitlines()[0].split(",")]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    # a reading nvidia-smi cannot give (inf, nan, a negative or absurd size) is no reading, not a crash
    if out.returncode != 0 or len(values) != 2 or not all(math.isfinite(v) and 0 <= v < 2**40 for v in values):
        return None
    free, total = (int(v) * 2**20 for v in values)
    return DeviceMemory(free, total)


@dataclass
class DevicePlacer:
    """Places runs on ``devices`` (each a ``CUDA_VISIBLE_DEVICES`` value: "0", or "0,1" for a 2-GPU run)."""

    devices: list[str]
    runs_per_device: int = 1
    probe: MemoryProbe = nvidia_smi_probe
    need_bytes: int | None = None  # --device-memory-per-run; None: an equal share (K > 1) or no check (K = 1)
    settle_seconds: float = SETTLE_SECONDS
    clock: Callable[[], float] = time.monotonic
    started: dict[int, list[float]] = field(default_factory=dict)  # device -> start times of its runs
    waiting: str = ""  # why the last place() found no device
    blind: bool = False  # a check was wanted and the probe could not read a device's memory

    def _need(self, memory: DeviceMemory) -> int | None:
        if self.need_bytes is not None:
            return self.need_bytes
        return None if self.runs_per_device == 1 else int(memory.total / self.runs_per_device * SHARE_MARGIN)

    def _memory(self, device: int) -> list[DeviceMemory] | None:
        found = [self.probe(gpu) for gpu in self.devices[device].split(",")]
        return None if any(m is None for m in found) else found

    def check_possible(self) -> None:
        """Refuse a need that no device could ever hold (the run would wait for ever)."""
        if self.need_bytes is None:
            return
        for device in range(len(self.devices)):
            memory = self._memory(device)
            if memory is None or all(m.total >= self.need_bytes for m in memory):
                return
        largest = max(m.total for d in range(len(self.devices)) for m in self._memory(d) or [])
        raise UserError(f"--device-memory-per-run {self.need_bytes / GIB:.1f} GiB is more than a whole device holds "
                        f"({largest / GIB:.1f} GiB): no run could ever start. State a smaller need.")

    def place(self) -> int | None:
        """The device the next run starts on, or None (it waits; ``waiting`` says why)."""
        now = self.clock()
        reasons = []
        order = sorted(range(len(self.devices)), key=lambda d: (len(self.started.get(d, [])), d))
        for device in order:
            runs = self.started.get(device, [])
            if len(runs) >= self.runs_per_device:
                reasons.append(f"device {self.devices[device]} holds {len(runs)} runs (--runs-per-device "
                               f"{self.runs_per_device})")
                continue
            memory = self._memory(device)
            if memory is None:
                self.blind = self.blind or self.need_bytes is not None or self.runs_per_device > 1
                return device
            short = self._shortfall(memory, sum(now - t < self.settle_seconds for t in runs))
            if short is None:
                return device
            reasons.append(f"device {self.devices[device]}: {short}")
        self.waiting = "; ".join(reasons)
        return None

    def _shortfall(self, memory: list[DeviceMemory], settling: int) -> str | None:
        """Why a run does not fit on a device with ``memory`` (one reading per GPU), or None if it fits."""
        for m in memory:
            need = self._need(m)
            if need is None:
                continue
            available = m.free - settling * need  # runs just started have not allocated yet
            if available < need:
                return (f"{m.free / GIB:.1f} GiB free" + (f", {settling} run(s) still starting" if settling else "")
                        + f", a run needs {need / GIB:.1f} GiB")
        return None

    def start(self, device: int) -> float:
        started = self.clock()
        self.started.setdefault(device, []).append(started)
        return started

    def finish(self, device: int, started: float) -> None:
        self.started[device].remove(started)
