"""Task heads: backbone features (B, D) -> flat logits (B, L) for all tasks at once.

All tasks are computed in one batched op (one matmul for ``linear``; grouped einsums for the
layer stacks), never a Python loop over tasks: with 40 CelebA heads a loop would dominate the
step time of a small backbone.

A head may be *stochastic* (``stochastic = True``: each forward draws a new sample, so an
evaluation averages several forwards) and may add a term to the loss (``auxiliary_loss()``,
e.g. the KL divergence of a variational head); both default to off.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.registry import Registry

HEADS: Registry[type[nn.Module]] = Registry("head")


class Heads(nn.Module):
    """Base: the contract every head shares (deterministic, no extra loss term)."""

    stochastic: bool = False

    def auxiliary_loss(self) -> torch.Tensor | float:
        """A term added to the training loss, from the last forward (0 for ordinary heads)."""
        return 0.0


@HEADS.register("linear")
class LinearHeads(Heads):
    """One linear classifier per task, stored as one (L, D) weight: heads = the final FC layer."""

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, layout.total)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)


def _uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """torch.nn.Linear's default initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), per task."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class _GroupedStack(Heads):
    """Per-task Linear(D, 3Z) -> ReLU -> Linear(3Z, out) -> ... -> Linear(Z, K_t), batched.

    Weights of the first two layers are stacked over tasks, (T, in, out), and applied with one
    einsum each. The last layer stores one Z-vector per logit column, (L, Z), and reads the
    latent of the column's task, so tasks with different K_t still share one op.
    """

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int, second_out: int) -> None:
        super().__init__()
        tasks, hidden = layout.num_tasks, 3 * latent_dim
        self.latent_dim = latent_dim
        self.w1, self.b1 = _uniform((tasks, in_features, hidden), in_features), _uniform((tasks, hidden), in_features)
        self.w2, self.b2 = _uniform((tasks, hidden, second_out), hidden), _uniform((tasks, second_out), hidden)
        self.w3, self.b3 = _uniform((layout.total, latent_dim), latent_dim), _uniform((layout.total,), latent_dim)
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, T, second_out): the first two layers of every task."""
        h = torch.relu(torch.einsum("bd,tdh->bth", features, self.w1) + self.b1)
        return torch.einsum("bth,thz->btz", h, self.w2) + self.b2

    def output(self, latent: torch.Tensor) -> torch.Tensor:
        """(B, T, Z) -> flat logits (B, L): each column reads its own task's latent."""
        return torch.einsum("blz,lz->bl", latent[:, self.column_task], self.w3) + self.b3


@HEADS.register("mlp")
class MLPHeads(_GroupedStack):
    """The TST head (Jordahn & Olmos, 2024), per task: Linear(D,3Z) -> ReLU -> Linear(3Z,Z) -> Linear(Z,K).

    Used by TST's second stage and, as the Stackelberg leader, by COG-TST. ``latent_dim`` Z = 0
    means Z = D (the backbone width).
    """

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        z = latent_dim or in_features
        super().__init__(in_features, layout, z, second_out=z)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden(features))


@HEADS.register("variational")
class VariationalHeads(_GroupedStack):
    """The V-TST head (Jordahn & Olmos, 2024): a Gaussian latent per task and sample.

    Per task: Linear(D,3Z) -> ReLU -> Linear(3Z, 2Z) gives the mean and log-variance of
    q(z | x) = N(mu, sigma^2); z is drawn by reparameterisation on every forward (training and
    evaluation: an evaluation averages the probabilities of several forwards) and mapped by
    Linear(Z, K). ``auxiliary_loss`` is KL(q(z|x) || N(0, I)) from the last forward, summed over
    the latent dimensions, averaged over samples and tasks (the tasks' losses are averaged too).
    """

    stochastic = True

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        z = latent_dim or in_features
        super().__init__(in_features, layout, z, second_out=2 * z)
        self._kl: torch.Tensor | None = None

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean, log_var = self.hidden(features).chunk(2, dim=-1)
        log_var = log_var.clamp(-20.0, 20.0)  # exp() of an extreme value would overflow
        latent = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        self._kl = 0.5 * (mean.pow(2) + log_var.exp() - 1.0 - log_var).sum(-1).mean()
        return self.output(latent)

    def auxiliary_loss(self) -> torch.Tensor | float:
        return 0.0 if self._kl is None else self._kl
