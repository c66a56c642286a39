"""Task heads: backbone features (B, D) -> flat logits (B, L) for all tasks at once.

All tasks are computed in one batched op (one matmul for ``linear``; grouped einsums for the
layer stacks), never a Python loop over tasks: with 40 CelebA heads a loop would dominate the
step time of a small backbone.

A head may be *stochastic* (``stochastic = True``: each forward draws a new sample, so an
evaluation averages several forwards) and may add a term to each task's loss
(``auxiliary_loss()``, e.g. the KL divergence of a variational head); both default to off.
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
    # False for a head whose extra parts (sample averaging at evaluation, an auxiliary loss) only
    # the two-stage network and loop apply; preflight refuses it as ``model.head``.
    supports_one_stage: bool = True

    def auxiliary_terms(self) -> torch.Tensor | None:
        """Per-sample, per-task terms (B, T) of the last forward that the training losses add, reduced like
        each task's loss (``WithAuxiliaryLoss``: over the samples labelled for the task); None: ordinary heads."""
        return None

    def auxiliary_loss(self) -> torch.Tensor | float:
        """Those terms' batch means (T,) (0 for ordinary heads)."""
        terms = self.auxiliary_terms()
        return 0.0 if terms is None else terms.mean(0)


@HEADS.register("linear")
class LinearHeads(Heads):
    """One linear classifier per task, stored as one (L, D) weight: heads = the final FC layer."""

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, layout.total)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)


def uniform_parameter(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """torch.nn.Linear's default initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), per task."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


def _stack_parameters(tasks: int, in_features: int, latent_dim: int) -> tuple[nn.Parameter, ...]:
    """Weights and biases of T stacks Linear(D, 3Z) -> ReLU -> Linear(3Z, Z), stacked over tasks."""
    hidden = 3 * latent_dim
    return (uniform_parameter((tasks, in_features, hidden), in_features),
            uniform_parameter((tasks, hidden), in_features),
            uniform_parameter((tasks, hidden, latent_dim), hidden),
            uniform_parameter((tasks, latent_dim), hidden))


def _apply_stack(features: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """(B, D) -> (B, T, Z): every task's stack, one einsum per layer."""
    h = torch.relu(torch.einsum("bd,tdh->bth", features, w1) + b1)
    return torch.einsum("bth,thz->btz", h, w2) + b2


class _GroupedStack(Heads):
    """Per-task Linear(D, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, K_t), batched over tasks.

    Weights of the first two layers are stacked over tasks, (T, in, out), and applied with one
    einsum each. The last layer stores one Z-vector per logit column, (L, Z), and reads the
    latent of the column's task, so tasks with different K_t still share one op.
    """

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        self.w1, self.b1, self.w2, self.b2 = _stack_parameters(layout.num_tasks, in_features, latent_dim)
        self.w3 = uniform_parameter((layout.total, latent_dim), latent_dim)
        self.b3 = uniform_parameter((layout.total,), latent_dim)
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, T, Z): the first two layers of every task."""
        return _apply_stack(features, self.w1, self.b1, self.w2, self.b2)

    def output(self, latent: torch.Tensor) -> torch.Tensor:
        """(B, T, Z) -> flat logits (B, L): each column reads its own task's latent."""
        return torch.einsum("blz,lz->bl", latent[:, self.column_task], self.w3) + self.b3


@HEADS.register("mlp")
class MLPHeads(_GroupedStack):
    """The TST head (Jordahn & Olmos, 2024), per task: Linear(D,3Z) -> ReLU -> Linear(3Z,Z) -> Linear(Z,K).

    Used by TST's second stage and, as the Stackelberg leader, by COG-TST. ``latent_dim`` Z = 0
    means Z = D (the backbone width). There is no non-linearity between the last two layers, as
    in the authors' code.
    """

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__(in_features, layout, latent_dim or in_features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden(features))


def gaussian_kl(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(log_var)) || N(0, I)) summed over the last (latent) dimension."""
    return 0.5 * (mean.pow(2) + log_var.exp() - 1.0 - log_var).sum(-1)


@HEADS.register("variational")
class VariationalHeads(_GroupedStack):
    """The V-TST head (Jordahn & Olmos, 2024): a Gaussian latent q(z | x) = N(mu, sigma^2) per task and sample.

    Per task, as the authors' code: two separate stacks Linear(D,3Z) -> ReLU -> Linear(3Z,Z), one
    for the mean mu (``w1 .. b2``, the TST stack) and one whose output r gives the log-variance
    log sigma^2 = logsigmoid(r), so sigma^2 = sigmoid(r) is at most 1 (and never overflows);
    z = mu + eps * sigma is drawn on every forward (training and evaluation: an evaluation
    averages the probabilities of several forwards, see ``two_stage.py``) and mapped by Linear(Z, K).

    ``auxiliary_loss()`` is, per task t, the authors' KL term of the last forward: the batch mean
    of sum_d KL_d / Z, with KL_d the divergence of latent dimension d from N(0, 1). It is added to
    task t's loss (``WithAuxiliaryLoss``); the mean over tasks of the training step then gives each
    task's head exactly the authors' single-task objective NLL + KL / Z, scaled by 1/T like its NLL.
    Partly labelled data: the mean is over the samples labelled for t (``auxiliary_terms`` gives the
    per-sample terms), as t's NLL is, so t's objective is the authors' one on t's labelled subset.

    Only two-stage runs can use it (``supports_one_stage = False``): the one-stage network neither
    adds the KL term nor averages samples at evaluation.
    """

    stochastic = True
    supports_one_stage = False

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__(in_features, layout, latent_dim or in_features)
        z = self.latent_dim
        self.log_var_w1, self.log_var_b1, self.log_var_w2, self.log_var_b2 = _stack_parameters(
            layout.num_tasks, in_features, z)
        self._kl: torch.Tensor | None = None

    def moments(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, D) -> mean and log-variance (B, T, Z) of q(z | x); the log-variance is <= 0."""
        raw = _apply_stack(features, self.log_var_w1, self.log_var_b1, self.log_var_w2, self.log_var_b2)
        return self.hidden(features), nn.functional.logsigmoid(raw)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean, log_var = self.moments(features)
        latent = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        self._kl = gaussian_kl(mean, log_var) / self.latent_dim  # (B, T)
        return self.output(latent)

    def auxiliary_terms(self) -> torch.Tensor | None:
        """(B, T) per-sample, per-task KL term of the last forward (see the class docstring)."""
        return self._kl
