"""PCGrad (Yu et al., 2020): torchjd's weighting on the shared backbone, its random order seeded by the run.

PCGrad (Yu et al., 2020, "Gradient Surgery for Multi-Task Learning", Algorithm 1): each task
gradient is projected off the normal plane of every conflicting one, *in a random order of the
other tasks drawn anew for every task and step*, then the projected gradients are summed. The
order changes the result (the projections do not commute), so PCGrad is random: torchjd's
``PCGradWeighting`` draws each order with ``torch.randperm`` from torch's global generator. Here
those draws come from PCGrad's own generator instead, seeded by the run's seed (``build_aggregator``)
and kept in the buffer ``rng_state``, which the training state saves with the objective: a resumed
run continues the same sequence of orders (bit-exact), every process of a run draws the same order
(same seed, same number of steps), and nothing else that uses the global generator shifts it.
The sum makes the step about T times the mean's, which Adam normalises away.
"""

from __future__ import annotations

import numpy as np
import torch
from torchjd.aggregation import PCGradWeighting

from mtl_cog.objectives.aggregators.base import AGGREGATORS, GramianWeighting

STREAM = 0x50434752  # "PCGR": PCGrad's own stream of the run's seed, apart from the run's other generators


def generator_state(seed: int) -> torch.Tensor:
    """The CPU generator state PCGrad starts a run from (uint8), derived from the run's seed."""
    derived = int(np.random.SeedSequence([seed, STREAM]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(derived).get_state()


@AGGREGATORS.register("pcgrad")
class PCGrad(GramianWeighting):
    def __init__(self, num_tasks: int) -> None:
        super().__init__(num_tasks, PCGradWeighting())
        self.register_buffer("rng_state", generator_state(0))

    def seed(self, seed: int) -> None:
        self.rng_state = generator_state(seed).to(self.rng_state.device)

    def weights(self, gramian: torch.Tensor | None, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        # torchjd draws from the global CPU generator: lend it PCGrad's state for the call, keep what it leaves
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state.cpu())
            out = super().weights(gramian, losses, present)
            self.rng_state.copy_(torch.get_rng_state())
        return out
