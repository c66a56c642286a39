"""Run under ``accelerate launch`` by tests/test_robustness.py: NaN losses on process 0 only, nonfinite=skip.

Every process must skip the same batches (or DDP's gradient all-reduce would hang or spread NaN).
Prints one line per process: ``rank steps skipped finite agree``.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mtl_cog.data.batches import BatchTransform  # noqa: E402
from mtl_cog.data.task_api import SplitData, TaskSpec  # noqa: E402
from mtl_cog.training.accelerator import create_accelerator  # noqa: E402
from mtl_cog.training.step import train_one_epoch  # noqa: E402

accelerator = create_accelerator()
torch.manual_seed(0)
spec = TaskSpec("t", ("a",), (2,), (0.5,) * 3, (0.2,) * 3)
split = SplitData(torch.randint(0, 255, (64, 3, 8, 8), dtype=torch.uint8), torch.zeros(64, 1, dtype=torch.long))
network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 1))
optimizer = torch.optim.SGD(network.parameters(), lr=1e-3)
network, optimizer = accelerator.prepare(network, optimizer)
calls = 0


def objective(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    global calls
    calls += 1
    loss = logits.pow(2).mean(dim=0)
    return loss * float("nan") if accelerator.process_index == 0 and calls in (2, 5) else loss


transform = BatchTransform(spec, train=True, device=accelerator.device)
stats = train_one_epoch(accelerator, network, objective, optimizer, split, transform, 8, 0, 1, nonfinite="skip")
weight = accelerator.unwrap_model(network)[1].weight.detach()
both = accelerator.gather(weight.reshape(1, -1))
line = f"{accelerator.process_index} {stats['steps']} {stats['skipped']} {bool(torch.isfinite(weight).all())} "
sys.stdout.write(line + f"{bool(torch.equal(both[0], both[1]))}\n")  # one write: lines of two processes never mix
sys.stdout.flush()
accelerator.wait_for_everyone()
# Skip interpreter teardown: in this tiny script gloo's threads are sometimes destroyed while still
# joinable ("terminate called without an active exception", SIGABRT), also without any NaN.
os._exit(0)
