"""The aggregator contract: how the per-task losses of one minibatch become the shared backbone's gradient.

Multi-task training with a shared backbone and one head per task has T per-task gradients for the
backbone; *equal weights* (the COG paper's CelebA setup) follows their mean. An aggregator instead
returns task weights w (T,) from the T x T Gramian of those gradients (UPGrad, MGDA, PCGrad, IMTL-G,
Aligned-MTL: the ``torchjd`` library's weightings) or from the losses themselves (uncertainty
weighting), and the backbone follows sum_t w_t grad L_t. Which gradient every parameter group gets,
and why the COG leader is untouched, is in ``docs/guides/mtl.md`` and ``mtl_cog.training.aggregated_step``.

Every aggregator here is a *weighting* (the update is a combination of the task gradients with
weights computed from their Gramian), so it is applied with one backward pass through the
backbone. Where the Gramian is taken decides what the weights promise (``mtl.aggregate_on``):
on the backbone's *parameters* the aggregator's defining property (UPGrad, MGDA: no task's loss
rises to first order; IMTL-G: equal projections) holds for the backbone's update; on the shared
*features* it holds for the gradient at the representation only, a cheap heuristic: Sener &
Koltun's MGDA-UB bound justifies it for MGDA alone, and for every weighting the backbone's kernel
between samples can turn a conflict-free feature step into a conflicting parameter step
(``mtl/conflict_rate`` measures how often; mtl_cog.training.aggregated_step). Aggregators that are
not a weighting (GradDrop, ConFIG: they edit the gradient coordinate by coordinate) need the full
parameter Jacobian and would change the heads' gradients too; they are not offered.

To add one: a module in this folder with a ``TaskAggregator`` subclass registered by
``@AGGREGATORS.register(name)``, imported in ``__init__.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.config.schema import EQUAL_WEIGHTS
from mtl_cog.registry import Registry

AGGREGATORS: Registry[type[nn.Module]] = Registry("aggregator")
EQUAL = EQUAL_WEIGHTS  # the mean of the per-task losses: plain training, no aggregator object at all


class TaskAggregator(nn.Module):
    """Base: ``weights(gramian, losses) -> (T,)`` non-negative task weights of the backbone's gradient.

    ``gramian`` is the (T, T) Gramian of the per-task gradients (w.r.t. the shared features or the
    shared parameters, ``mtl.aggregate_on``) of the tasks labelled in the batch, or None when
    ``needs_gramian`` is False; ``losses`` are those tasks' (T,) losses (detached). ``penalty`` is a
    term added to the backward pass for the aggregator's own learned parameters (0 for most).
    """

    needs_gramian: bool = True

    def __init__(self, num_tasks: int) -> None:
        super().__init__()
        self.num_tasks = num_tasks

    def weights(self, gramian: torch.Tensor | None, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """(T,) weights; ``present`` (T,) bool marks the tasks with a labelled sample in the batch (others get 0)."""
        raise NotImplementedError

    def penalty(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor | float:
        return 0.0

    def seed(self, seed: int) -> None:
        """Seed the aggregator's own random draws from the run's seed (most draw nothing)."""


class GramianWeighting(TaskAggregator):
    """A ``torchjd`` weighting of the Gramian (``torchjd.aggregation.*Weighting``), on the present tasks only.

    A task without a labelled sample in the batch has a zero gradient; left in, it would make MGDA
    pick the zero vector (the min-norm point of the hull) and stop training, so it is left out and
    weighted 0. The Gramian is solved in float64 (quadprog, as torchjd does) whatever the training
    precision: bf16 Gramians are too coarse for the dual-cone projections.
    """

    def __init__(self, num_tasks: int, weighting: nn.Module) -> None:
        super().__init__(num_tasks)
        self.weighting = weighting

    def weights(self, gramian: torch.Tensor | None, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        assert gramian is not None
        out = torch.zeros(self.num_tasks, dtype=torch.float64, device=gramian.device)
        index = present.nonzero().squeeze(1)
        if len(index):
            sub = gramian.to(torch.float64)[index][:, index]
            # a non-finite loss makes the Gramian NaN, which the solvers refuse: NaN weights instead, so the
            # step's non-finite policy (train.nonfinite) sees it like a NaN loss
            finite = bool(torch.isfinite(sub).all())
            out[index] = self.weighting(sub).to(torch.float64) if finite else torch.nan
        return out


def build_aggregator(name: str, num_tasks: int, seed: int = 0) -> TaskAggregator | None:
    """The registered aggregator ``name`` for ``num_tasks`` tasks, its random draws (if any) seeded by ``seed``
    (the run's); None for ``equal`` (plain training)."""
    if name == EQUAL:
        return None
    aggregator = AGGREGATORS.get(name)(num_tasks)
    aggregator.seed(seed)
    return aggregator
