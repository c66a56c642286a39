"""The network: timm backbone -> task heads -> calibrator, and its parameter bookkeeping."""

from __future__ import annotations

import difflib

import timm
import torch
from torch import nn

import mtl_cog.models.backbones  # noqa: F401  (registers our small CNNs with timm)
import mtl_cog.models.lipschitz  # noqa: F401  (registers the Lipschitz CNNs, head and LiST scales)
from mtl_cog.config import MethodConfig, ModelConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import HEADS


def create_backbone(cfg: ModelConfig) -> nn.Module:
    """A timm model without classifier (``num_classes=0``): images -> pooled features (B, D)."""
    if cfg.backbone not in timm.list_models():
        close = difflib.get_close_matches(cfg.backbone, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Close matches: {', '.join(close)}." if close else " See timm.list_models()."
        raise ConfigError(f"model.backbone: unknown timm model {cfg.backbone!r}.{hint}")
    kwargs = dict(cfg.timm_kwargs)
    if cfg.drop_rate:
        kwargs["drop_rate"] = cfg.drop_rate
    try:
        backbone = timm.create_model(cfg.backbone, pretrained=cfg.pretrained, num_classes=0, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.timm_kwargs {cfg.timm_kwargs} not accepted by {cfg.backbone!r}: {err}") from None
    if cfg.cifar_stem:
        _apply_cifar_stem(backbone, cfg.backbone)
    return backbone


def _apply_cifar_stem(backbone: nn.Module, name: str) -> None:
    """3x3 stride-1 first conv and no max-pool, the usual ResNet stem for 32x32 images."""
    conv = getattr(backbone, "conv1", None)
    if not isinstance(conv, nn.Conv2d) or not hasattr(backbone, "maxpool"):
        raise ConfigError(
            f"model.cifar_stem=true needs a ResNet-style backbone with conv1 and maxpool; {name!r} has none."
        )
    backbone.conv1 = nn.Conv2d(conv.in_channels, conv.out_channels, 3, stride=1, padding=1, bias=False)
    backbone.maxpool = nn.Identity()


class Network(nn.Module):
    """``calibrator(heads(backbone(x)))``; returns flat calibrated logits (B, L).

    ``with_features=True`` returns ``(features, logits)`` with the backbone's pooled features
    (B, D), for losses that need them (``needs_features``). It is a keyword of ``forward`` rather
    than a second method so that it runs through a DDP wrapper's forward (gradient sync).
    """

    def __init__(self, backbone: nn.Module, heads: nn.Module, calibrator: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = heads
        self.calibrator = calibrator

    def forward(self, images: torch.Tensor, with_features: bool = False):
        features = self.backbone(images)
        logits = self.calibrator(self.heads(features))
        return (features, logits) if with_features else logits

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self(images, with_features=True)


def build_calibrator(method_cfg: MethodConfig, layout: LogitLayout) -> nn.Module:
    """``method.calibrator`` for ``layout``; a calibrator with settings of its own (LiST's scale) reads
    them from the method config through its ``from_method`` constructor."""
    cls = CALIBRATORS.get(method_cfg.calibrator)
    from_method = getattr(cls, "from_method", None)
    return from_method(layout, method_cfg) if from_method is not None else cls(layout)


def build_network(model_cfg: ModelConfig, method_cfg: MethodConfig, layout: LogitLayout) -> Network:
    backbone = create_backbone(model_cfg)
    heads = HEADS.get(model_cfg.head)(backbone.num_features, layout, latent_dim=model_cfg.head_latent_dim)
    calibrator = build_calibrator(method_cfg, layout)
    if getattr(calibrator, "requires_lipschitz", False):  # LiST: L only means something on a Lipschitz map
        parts = (("model.backbone", model_cfg.backbone, backbone), ("model.head", model_cfg.head, heads))
        for key, name, part in parts:
            if not callable(getattr(part, "lipschitz_constant", None)):
                raise ConfigError(
                    f"{key}: method.calibrator={method_cfg.calibrator!r} scales a Lipschitz-constrained network, "
                    f"but {name!r} has no Lipschitz bound. Use model.backbone=cog_lipschitz_small (or _tiny) and "
                    "model.head=lipschitz (see docs/neighbour_methods.md)."
                )
    return Network(backbone, heads, calibrator)


def parameter_counts(network: Network) -> dict[str, int]:
    """Trainable parameters per part: backbone / heads / calibrator / total."""
    counts = {
        part: sum(p.numel() for p in getattr(network, part).parameters() if p.requires_grad)
        for part in ("backbone", "heads", "calibrator")
    }
    counts["total"] = sum(counts.values())
    return counts
