"""Lipschitz-constrained networks for LiST (Lipschitz Scaling Training): backbone, heads, the scale L.

A LiST network is ``z = L_t * h_t(g(x))``: a backbone ``g`` and per-task heads ``h_t`` that are each
at most 1-Lipschitz (l2 -> l2), and one scale ``L_t`` per task on the logits. Scaling ``L_t`` by c is
*exactly* temperature scaling with T = 1/c, which is why LiST can calibrate by moving L (see
``ListScale``) and why a certified radius follows from the logit margin and L
(``mtl_cog.evaluation.robustness``).

Library choice: torch's own ``torch.nn.utils.parametrizations.spectral_norm`` normalises every
convolution. deel-torchlip and orthogonium (orthogonal convolutions, tighter) are not installable
here (not on the package index this project uses), and spectral_norm is maintained with torch,
works with ``torch.compile``, DDP and safetensors checkpoints, and needs no extra dependency.
What it does *not* give is a certified bound, for two reasons we correct by hand:

- it divides a convolution's weight by the spectral norm of its reshaped (out, in*kh*kw) matrix,
  which does not bound the convolution itself: each input pixel enters up to kh*kw patches, so
  ``||conv|| <= sqrt(kh*kw) * ||W_mat||``; ``LipschitzConv2d`` divides by that factor too;
- its power iteration *under*-estimates sigma (u^T W v <= ||W||), so ``lipschitz_constant``
  recomputes every layer's norm exactly (SVD, ``torch.linalg.matrix_norm(ord=2)``) instead of
  assuming 1. The reported constant is therefore a sound upper bound however far power
  iteration has converged.

Activations are MaxMin (GroupSort with groups of 2: sort each channel pair), 1-Lipschitz and
gradient-norm preserving, unlike ReLU which loses half the signal in Lipschitz nets (Anil et al.,
2019). Down-sampling is a 2x2 average pool times 2 and the global pool a sum / sqrt(H*W), both
exactly 1-Lipschitz. No BatchNorm: its affine rescaling has no bound.

The heads normalise each task's weights themselves (one row per binary task to unit norm, one
block per K-class task by its spectral norm): spectral_norm on the flat (L, D) head matrix would
bound all tasks jointly and let one task's large weights shrink every other task's logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.models import register_model
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.calibrators import CALIBRATORS, fit_temperatures
from mtl_cog.models.heads import HEADS, Heads


def max_min(x: torch.Tensor) -> torch.Tensor:
    """MaxMin over channel pairs: (a, b) -> (max(a, b), min(a, b)); 1-Lipschitz, norm preserving."""
    a, b = x.chunk(2, dim=1)
    return torch.cat([torch.maximum(a, b), torch.minimum(a, b)], dim=1)


class LipschitzConv2d(nn.Module):
    """A spectrally normalised convolution divided by sqrt(kh*kw): at most 1-Lipschitz (see module doc)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3) -> None:
        super().__init__()
        self.conv = spectral_norm(nn.Conv2d(cin, cout, kernel, padding=kernel // 2))
        self.unfold_factor = math.sqrt(kernel * kernel)  # each pixel enters kernel^2 patches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) / self.unfold_factor

    def evaluated_weight(self) -> torch.Tensor:
        """The normalised weight the layer uses in evaluation, without a power-iteration step.

        Reading ``conv.weight`` in training mode would run one power iteration and so change the
        network; the parametrisation is switched to evaluation for the read."""
        normaliser = self.conv.parametrizations.weight[0]
        was_training = normaliser.training
        normaliser.eval()
        try:
            return self.conv.weight.detach()
        finally:
            normaliser.train(was_training)

    def lipschitz_constant(self) -> torch.Tensor:
        """Exact ||W_mat||_2 of the normalised weight (times sqrt(kh kw) / sqrt(kh kw))."""
        return torch.linalg.matrix_norm(self.evaluated_weight().double().flatten(1), ord=2)


class LipschitzCNN(nn.Module):
    """Conv-MaxMin-Conv-MaxMin-pool blocks and a global pool: at most 1-Lipschitz, timm's contract."""

    def __init__(self, widths: tuple[int, ...], num_classes: int = 0, in_chans: int = 3, drop_rate: float = 0.0,
                 **_timm_kwargs) -> None:
        super().__init__()
        if any(w % 2 for w in widths):
            raise ValueError(f"MaxMin needs an even number of channels per layer, got widths {widths}.")
        layers, cin = [], in_chans
        for width in widths:
            layers.append(nn.ModuleList([LipschitzConv2d(cin, width), LipschitzConv2d(width, width)]))
            cin = width
        self.blocks = nn.ModuleList(layers)
        self.num_features = cin
        self.drop = nn.Dropout(drop_rate)  # identity in evaluation, where the bound is used
        self.num_classes = num_classes
        self.fc = nn.Identity()
        if num_classes:
            raise ValueError("LipschitzCNN is a backbone (num_classes=0); the Lipschitz heads classify.")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for first, second in self.blocks:
            x = max_min(second(max_min(first(x))))
            x = F.avg_pool2d(x, 2) * 2.0  # 2x2 mean of 4 values times 2: exactly 1-Lipschitz
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        pooled = x.sum(dim=(2, 3)) / math.sqrt(x.shape[2] * x.shape[3])  # sum / sqrt(n): 1-Lipschitz
        return self.drop(pooled)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if num_classes:
            raise ValueError("LipschitzCNN is a backbone (num_classes=0); the Lipschitz heads classify.")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def lipschitz_constant(self) -> torch.Tensor:
        """A sound l2 bound of images -> features: the product of every layer's exact bound."""
        bound = torch.ones((), dtype=torch.float64)
        for block in self.blocks:
            for conv in block:
                bound = bound * conv.lipschitz_constant().cpu()
        return bound


@register_model
def cog_lipschitz_tiny(pretrained: bool = False, **kwargs) -> LipschitzCNN:
    """~30k parameters, 1-Lipschitz: for tests and CPU-scale LiST runs."""
    if pretrained:
        raise ValueError("cog_lipschitz_tiny has no pretrained weights.")
    return LipschitzCNN((16, 32), **kwargs)


@register_model
def cog_lipschitz_small(pretrained: bool = False, **kwargs) -> LipschitzCNN:
    """~290k parameters, 1-Lipschitz: the LiST counterpart of cog_cnn_small."""
    if pretrained:
        raise ValueError("cog_lipschitz_small has no pretrained weights.")
    return LipschitzCNN((32, 64, 128), **kwargs)


@HEADS.register("lipschitz")
class LipschitzHeads(Heads):
    """Per-task linear heads, each at most 1-Lipschitz: a binary task's row has unit l2 norm, a K-class
    task's (K, D) block is divided by its spectral norm (exact SVD; K is small)."""

    def __init__(self, in_features: int, layout: LogitLayout, latent_dim: int = 0) -> None:
        super().__init__()
        self.layout = layout
        linear = nn.Linear(in_features, layout.total)  # torch's initialisation, then normalised per task
        self.weight, self.bias = linear.weight, linear.bias
        self.register_buffer("binary_columns", layout.binary_columns.clone(), persistent=False)

    def normalised_weight(self) -> torch.Tensor:
        weight = self.weight
        blocks = []
        if self.layout.binary_tasks:
            rows = F.normalize(weight[self.binary_columns], dim=1)
            blocks.append((self.binary_columns, rows))
        for t in self.layout.multiclass_tasks:
            block = weight[self.layout.task_slice(t)]
            cols = torch.arange(self.layout.offsets[t], self.layout.offsets[t] + self.layout.widths[t],
                                device=weight.device)
            blocks.append((cols, block / torch.linalg.matrix_norm(block, ord=2)))
        out = torch.empty_like(weight)
        for cols, values in blocks:
            out = out.index_copy(0, cols, values)
        return out

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.normalised_weight(), self.bias)

    def lipschitz_constant(self) -> torch.Tensor:
        """(T,) exact l2 bound of features -> task t's logits (1 up to rounding)."""
        weight = self.normalised_weight().detach().double().cpu()
        return torch.stack([torch.linalg.matrix_norm(weight[self.layout.task_slice(t)], ord=2)
                            for t in range(self.layout.num_tasks)])


class LipschitzScale(nn.Module):
    """One Lipschitz scale L_t per task on the logits of a 1-Lipschitz network: z_t = L_t * h_t(x).

    Registered twice. ``lipschitz_scale``: L is a parameter, trained by gradient (``cog_list``: the
    Stackelberg leader at ``optim.leader_lr``). ``list``: L is not trained by gradient; after each
    validation it moves toward the value at which the network is calibrated (``on_validation_end``).
    Built from a layout alone it is the identity (L = 1), as every calibrator; a run starts from
    ``method.list_init`` (``from_method``), since a 1-Lipschitz map's logits are small.
    """

    requires_lipschitz = True  # build_network refuses a backbone or head without a Lipschitz bound
    learned = True

    def __init__(self, layout: LogitLayout, init: float = 1.0, rate: float = 0.5) -> None:
        super().__init__()
        self.layout, self.init, self.rate = layout, float(init), float(rate)
        log_l = torch.full((layout.num_tasks,), math.log(init))
        if self.learned:
            self.log_lipschitz = nn.Parameter(log_l)
        else:
            self.register_buffer("log_lipschitz", log_l)
        self.register_buffer("column_task", layout.column_task.clone(), persistent=False)

    @classmethod
    def from_method(cls, layout: LogitLayout, method_cfg: MethodConfig) -> LipschitzScale:
        return cls(layout, init=method_cfg.list_init, rate=method_cfg.list_rate)

    @property
    def lipschitz(self) -> torch.Tensor:
        return self.log_lipschitz.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.log_lipschitz.exp()[self.column_task]

    def lipschitz_constant(self) -> torch.Tensor:
        return self.lipschitz.detach().double().cpu()

    def by_task(self, task_names: list[str]) -> dict[str, dict[str, object]]:
        return {"lipschitz": dict(zip(task_names, self.lipschitz.detach().cpu().double().tolist()))}

    def identity_distance(self) -> float:
        """Largest relative change of L from its initial value (the scale's "identity")."""
        return float((self.log_lipschitz.detach() - math.log(self.init)).abs().max().expm1())


@CALIBRATORS.register("lipschitz_scale")
class LearnedLipschitzScale(LipschitzScale):
    """L trained by gradient with the rest of the step (COG: as the leader)."""


@CALIBRATORS.register("list")
class ListScale(LipschitzScale):
    """LiST's L update: after each validation, fit one temperature T_t per task on the validation
    logits (which already include L_t) and set ``L_t <- L_t * T_t ** -rate``.

    Since L_t * h / T_t = (L_t / T_t) * h, L_t / T_t is the scale at which this network is
    calibrated on validation (the L* of LiST); ``rate`` = 1 jumps there, smaller values move
    geometrically part of the way (the network keeps changing while it trains). A fitted T outside
    [e^-3, e^3] (a nearly constant validation task) is clipped so one epoch moves L by at most a
    factor e^3 * rate. A task without validation errors has no optimal T (``fit_calibrator``:
    the fit would run to T -> 0) and gets NaN, which, like any non-finite fit, leaves its L unchanged.

    L is thus fitted on the validation split: LiST's validation metrics (the epoch lines, the
    checkpoint choice, the fair protocol's tuning value) are in-sample, and the protocol's report
    marks them (``val_in_sample``, ``mtl_cog.experiments.protocol.fits_on_validation``).
    """

    learned = False

    def on_validation_end(self, predictions) -> None:
        if self.rate == 0:
            return
        temperatures = fit_temperatures(self.layout, predictions.logits, predictions.labels, predictions.task_names,
                                        what="LiST's scale update")  # NaN: no optimum, L stays
        log_t = temperatures.log().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp(-3.0, 3.0)
        self.log_lipschitz.sub_(self.rate * log_t.to(self.log_lipschitz))


def network_lipschitz(network: nn.Module) -> torch.Tensor | None:
    """(T,) l2 Lipschitz bound of normalised images -> task t's logits, or None when some part of the
    network (backbone, heads, calibrator) reports no bound (every ordinary network)."""
    parts = [getattr(network, name, None) for name in ("backbone", "heads", "calibrator")]
    bounds = [getattr(part, "lipschitz_constant", None) for part in parts]
    if not all(callable(bound) for bound in bounds):
        return None
    total = torch.ones((), dtype=torch.float64)
    for bound in bounds:
        total = total * bound().double().cpu()
    return total
