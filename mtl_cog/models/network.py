"""The network: timm backbone -> task heads -> calibrator, and its parameter bookkeeping."""

from __future__ import annotations

import difflib

import timm
import torch
from torch import nn

import mtl_cog.models.backbones  # noqa: F401  (registers our small CNNs with timm)
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
    if cfg.pretrained and not timm.is_model_pretrained(cfg.backbone):
        # timm would only warn and go on with random weights: a setting that did not take effect
        raise ConfigError(f"model.pretrained=true: timm has no pretrained weights for {cfg.backbone!r}. Set "
                          "model.pretrained=false, or choose a model from timm.list_models(pretrained=True).")
    kwargs = dict(cfg.timm_kwargs)
    if cfg.drop_rate:
        kwargs["drop_rate"] = cfg.drop_rate
    try:
        backbone = timm.create_model(cfg.backbone, pretrained=cfg.pretrained, num_classes=0, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.timm_kwargs {cfg.timm_kwargs} not accepted by {cfg.backbone!r}: {err}") from None
    except Exception as err:  # noqa: BLE001  (downloads fail in many ways: offline, hub errors, a damaged cache)
        if not cfg.pretrained:
            raise
        raise ConfigError(
            f"model.pretrained=true: the pretrained weights of {cfg.backbone!r} could not be loaded "
            f"({type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}). "
            "Without network access, download them once on a machine that has it (they are kept in the "
            "Hugging Face cache, HF_HOME) and set HF_HUB_OFFLINE=1; or set model.pretrained=false."
        ) from None
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
    """``calibrator(heads(backbone(x)))``; returns flat calibrated logits (B, L)."""

    def __init__(self, backbone: nn.Module, heads: nn.Module, calibrator: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = heads
        self.calibrator = calibrator

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.calibrator(self.heads(self.backbone(images)))


def build_network(model_cfg: ModelConfig, method_cfg: MethodConfig, layout: LogitLayout) -> Network:
    backbone = create_backbone(model_cfg)
    heads = HEADS.get(model_cfg.head)(backbone.num_features, layout, latent_dim=model_cfg.head_latent_dim)
    calibrator = CALIBRATORS.get(method_cfg.calibrator)(layout)
    return Network(backbone, heads, calibrator)


def parameter_counts(network: Network) -> dict[str, int]:
    """Trainable parameters per part: backbone / heads / calibrator / total."""
    counts = {
        part: sum(p.numel() for p in getattr(network, part).parameters() if p.requires_grad)
        for part in ("backbone", "heads", "calibrator")
    }
    counts["total"] = sum(counts.values())
    return counts
