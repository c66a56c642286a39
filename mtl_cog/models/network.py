"""The network: timm backbone -> task heads -> calibrator, and its parameter bookkeeping."""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import timm
import torch
from torch import nn

import mtl_cog.models.backbones  # noqa: F401  (registers our small CNNs with timm)
import mtl_cog.models.lipschitz  # noqa: F401  (registers the Lipschitz CNNs, head and LiST scales)
from mtl_cog.cog import apply_calibrator, make_calibrator
from mtl_cog.config import MethodConfig, ModelConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import HEADS


def check_backbone(name: str, key: str = "model.backbone") -> None:
    """Refuse a backbone timm does not know, naming ``key`` and close matches."""
    known = timm.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
        hint = f" Close matches: {', '.join(close)}." if close else " See timm.list_models()."
        raise ConfigError(f"{key}: unknown timm model {name!r}.{hint}")


def create_backbone(cfg: ModelConfig) -> nn.Module:
    """A timm model without classifier (``num_classes=0``): images -> pooled features (B, D)."""
    check_backbone(cfg.backbone)
    if cfg.pretrained:
        check_pretrained_weights_exist(cfg)
    kwargs = dict(cfg.timm_kwargs)
    if cfg.drop_rate:
        kwargs["drop_rate"] = cfg.drop_rate
    try:
        with _missing_weights_reported() as missing:
            backbone = timm.create_model(cfg.backbone, pretrained=cfg.pretrained, num_classes=0, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.timm_kwargs {cfg.timm_kwargs} not accepted by {cfg.backbone!r}: {err}") from None
    except Exception as err:  # noqa: BLE001  (downloads fail in many ways: offline, hub errors, a damaged cache)
        if not cfg.pretrained:
            raise
        raise ConfigError(pretrained_weights_error(cfg, err)) from None
    if cfg.pretrained and missing and _weight_source(cfg):
        raise ConfigError(
            f"model.pretrained=true: the weights from {_weight_source(cfg)} lack {len(missing)} of the tensors of "
            f"{cfg.backbone!r} (e.g. {', '.join(missing[:3])}), which would stay randomly initialised. Give weights "
            "of this architecture with timm's parameter names (a checkpoint of the whole model, not a wrapper)."
        )
    if cfg.cifar_stem:
        _apply_cifar_stem(backbone, cfg.backbone)
    return backbone


# Where timm takes weights from instead of its registry (``model.timm_kwargs.pretrained_cfg_overlay``).
_WEIGHT_SOURCE_KEYS = ("file", "url", "hf_hub_id", "state_dict")


def _weight_source(cfg: ModelConfig) -> str | None:
    """The user-given weight source (``pretrained_cfg_overlay``), or None for timm's own registry weights."""
    overlay = cfg.timm_kwargs.get("pretrained_cfg_overlay") or {}
    key = next((k for k in _WEIGHT_SOURCE_KEYS if overlay.get(k)), None)
    return None if key is None else f"model.timm_kwargs.pretrained_cfg_overlay.{key}"


def check_pretrained_weights_exist(cfg: ModelConfig) -> None:
    """``model.pretrained=true`` must load weights: timm would only warn and train from random ones
    when it has none for the model, a setting that silently did not take effect."""
    overlay = cfg.timm_kwargs.get("pretrained_cfg_overlay") or {}
    if overlay.get("file") and not Path(overlay["file"]).is_file():
        raise ConfigError(f"model.timm_kwargs.pretrained_cfg_overlay.file: no file at {overlay['file']}.")
    if _weight_source(cfg) is not None or timm.is_model_pretrained(cfg.backbone):
        return
    raise ConfigError(
        f"model.pretrained=true: timm has no pretrained weights for {cfg.backbone!r}. Set model.pretrained=false, "
        "choose a model from timm.list_models(pretrained=True) (e.g. resnet18, resnet50, resnet101), or give a "
        "weights file with model.timm_kwargs.pretrained_cfg_overlay.file=/path/to/weights.safetensors."
    )


@contextmanager
def _missing_weights_reported() -> Iterator[list[str]]:
    """The model tensors timm found no weights for while loading pretrained ones.

    timm loads with ``strict=False`` when the classifier is dropped (``num_classes=0``) and reports
    what it could not place only in an INFO log record ("Missing keys (a, b) discovered ..."). Its
    own registry weights always fit; a user's file with other names (a wrapper's ``model.`` prefix,
    another architecture) would leave those layers random without this check.
    """
    missing: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = re.match(r"Missing keys \((.*)\) discovered", record.getMessage())
            if found:
                missing.extend(found.group(1).split(", "))

    logger, handler = logging.getLogger("timm.models._builder"), Collect(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield missing
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def pretrained_weights_error(cfg: ModelConfig, err: Exception) -> str:
    """The one-line error for weights that could not be fetched or loaded, saying how to fetch them beforehand.

    timm downloads weights from the Hugging Face Hub (or a URL) into a cache; a compute node
    without internet fails only after the hub's retries. The remedy is timm's own ``cache_dir``
    argument, filled once on a machine with internet (see docs/guides/tracking.md, "Pretrained weights").
    """
    first_line = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    what = f"{type(err).__name__}: {first_line}"
    if not isinstance(err, OSError):  # the file was read, but the weights do not fit this model
        return (f"model.pretrained=true: the pretrained weights could not be loaded into {cfg.backbone!r} ({what}). "
                "Check that model.timm_kwargs.pretrained_cfg_overlay points at weights of this architecture.")
    return (
        f"model.pretrained=true: the pretrained weights of {cfg.backbone!r} could not be fetched or read ({what}). "
        f"On a machine with internet run: python -c \"import timm; timm.create_model('{cfg.backbone}', "
        "pretrained=True, cache_dir='timm_weights')\", copy timm_weights/ to this machine and add "
        "model.timm_kwargs.cache_dir=/path/to/timm_weights (with HF_HUB_OFFLINE=1 nothing is tried online); "
        "or point at a weights file: model.timm_kwargs.pretrained_cfg_overlay.file=/path/to/weights.safetensors; "
        "or set model.pretrained=false."
    )


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

    The calibrator is applied by ``mtl_cog.cog.apply_calibrator``, the public API's own wiring, so a
    run and a user's loop on ``mtl_cog.cog`` compute the same thing (``tests/test_cog_equivalence.py``).

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
        if with_features:
            # The returned features must be the tensor the heads read (losses and aggregators differentiate
            # w.r.t. them). Under bf16/fp16 Accelerate hands out a float32 *copy* of a half-precision output,
            # which nothing downstream uses; made float32 here, they are returned as they are. (float() of
            # float32 features is the tensor itself; autocast still runs the heads in half precision.)
            features = features.float()
        logits = apply_calibrator(self.calibrator, self.heads(features))
        return (features, logits) if with_features else logits

    def forward_with_features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self(images, with_features=True)


def build_calibrator(method_cfg: MethodConfig, layout: LogitLayout) -> nn.Module:
    """``method.calibrator`` for ``layout`` (``mtl_cog.cog.make_calibrator``); a calibrator with settings of its
    own (LiST's scale) reads them from the method config through its ``from_method`` constructor."""
    from_method = getattr(CALIBRATORS.get(method_cfg.calibrator), "from_method", None)
    return from_method(layout, method_cfg) if from_method is not None else make_calibrator(method_cfg.calibrator,
                                                                                           layout)


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
                    "model.head=lipschitz (see docs/explanation/neighbour_methods.md)."
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
