"""Run under ``accelerate launch`` by tests/test_aggregators.py: the aggregated step on two processes.

Each process gets half of a global batch (with missing labels). After the
step's backward, DDP has averaged the gradients; they must equal the gradients of one process
computing the same aggregated step on the whole batch (recomputed here on every process, outside
DDP). Prints one line per process: ``rank aggregator features_ok parameters_ok``.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from mtl_cog.config import MethodConfig  # noqa: E402
from mtl_cog.constants import MISSING_LABEL  # noqa: E402
from mtl_cog.data.task_api import LogitLayout  # noqa: E402
from mtl_cog.models.calibrators import CALIBRATORS  # noqa: E402
from mtl_cog.models.heads import LinearHeads  # noqa: E402
from mtl_cog.models.network import Network  # noqa: E402
from mtl_cog.objectives import build_objective  # noqa: E402
from mtl_cog.objectives.aggregators import build_aggregator  # noqa: E402
from mtl_cog.training.accelerator import create_accelerator  # noqa: E402
from mtl_cog.training.aggregated_step import Aggregation, aggregated_loss  # noqa: E402


class OneProcess:
    """What ``aggregated_loss`` needs of an Accelerator, for the single-process reference."""

    num_processes, scaler = 1, None


def network(layout: LogitLayout) -> Network:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.Tanh())
    return Network(backbone, LinearHeads(6, layout), CALIBRATORS.get("temperature")(layout))


accelerator = create_accelerator()
rank = accelerator.process_index
layout = LogitLayout((2, 2, 2, 3))
objective = build_objective(layout, MethodConfig(loss="ce"))
generator = torch.Generator().manual_seed(1)
images = torch.randn(16, 3, 2, 2, generator=generator)
labels = torch.stack([torch.randint(0, k, (16,), generator=generator) for k in layout.num_classes], 1)
# as many unlabelled rows of a task on each process: then DDP's mean of the processes' task means is the
# whole batch's task mean (with unequal counts it is not, as for any ignore_index loss under DDP; docs/guides/mtl.md)
labels[:, 2] = torch.where(torch.arange(16) % 8 < 5, MISSING_LABEL, labels[:, 2])
labels[:, 3] = torch.where(torch.arange(16) % 3 == 0, MISSING_LABEL, labels[:, 3])
results = []
for name in ("mgda", "upgrad", "uncertainty"):
    ok = []
    for on in ("features", "parameters"):
        reference = network(layout)
        aggregator = build_aggregator(name, layout.num_tasks)
        out = aggregated_loss(OneProcess(), reference, objective, Aggregation(aggregator, on), images, labels,
                              list(reference.backbone.parameters()))
        reference.zero_grad()
        out.backward.backward()
        model = network(layout)
        prepared = accelerator.prepare(model)
        shard = slice(8 * rank, 8 * rank + 8)
        out = aggregated_loss(accelerator, prepared, objective, Aggregation(aggregator, on), images[shard],
                              labels[shard], list(model.backbone.parameters()))
        prepared.zero_grad()
        accelerator.backward(out.backward)
        ok.append(all(torch.allclose(a.grad, b.grad, atol=1e-6)
                      for a, b in zip(model.parameters(), reference.parameters(), strict=True)))
    results.append(f"{rank} {name} {ok[0]} {ok[1]}")
sys.stdout.write("\n".join(results) + "\n")  # one write: lines of two processes never mix
sys.stdout.flush()
accelerator.wait_for_everyone()
os._exit(0)  # as tests/launch_nonfinite_skip.py: skip gloo's teardown
