"""Small CPU-friendly CNN backbones, registered with timm.

Registering them with ``timm.models.register_model`` keeps a single way to build any backbone
(``timm.create_model(name, num_classes=0)``) and the timm contract (``num_features``,
``forward_features``, ``forward_head``, ``reset_classifier``), so the rest of the code never
special-cases our own models. Use them for demos and tests; paper configs use timm ResNets.

They take exactly the arguments they use (``num_classes``, ``in_chans``, ``drop_rate``): any other
``model.timm_kwargs`` entry is a ``TypeError`` that ``mtl_cog.models.network`` reports, rather than
an option silently ignored. They have no pretrained weights (``model.pretrained=true`` is refused
before they are built: timm lists no weights for them).
"""

from __future__ import annotations

import torch
from timm.models import register_model
from torch import nn


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class SmallCNN(nn.Module):
    """VGG-style stack of conv blocks, global average pool, optional linear classifier."""

    def __init__(self, widths: tuple[int, ...], num_classes: int = 0, in_chans: int = 3,
                 drop_rate: float = 0.0) -> None:
        super().__init__()
        blocks, cin = [], in_chans
        for width in widths:
            blocks.append(_conv_block(cin, width))
            cin = width
        self.features = nn.Sequential(*blocks)
        self.num_features = cin
        self.drop = nn.Dropout(drop_rate)
        self.num_classes = num_classes
        self.fc = nn.Linear(cin, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(x.mean(dim=(2, 3)))
        return x if pre_logits else self.fc(x)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _small_cnn(name: str, widths: tuple[int, ...], pretrained: bool, pretrained_cfg: object = None,
               pretrained_cfg_overlay: object = None, cache_dir: object = None, **kwargs) -> SmallCNN:
    """timm passes the ``pretrained_cfg*`` and ``cache_dir`` arguments to every model; the rest is the user's."""
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights.")
    return SmallCNN(widths, **kwargs)


@register_model
def cog_cnn_tiny(pretrained: bool = False, **kwargs) -> SmallCNN:
    """~30k parameters: for tests."""
    return _small_cnn("cog_cnn_tiny", (16, 32), pretrained, **kwargs)


@register_model
def cog_cnn_small(pretrained: bool = False, **kwargs) -> SmallCNN:
    """~290k parameters: the CPU demo backbone."""
    return _small_cnn("cog_cnn_small", (32, 64, 128), pretrained, **kwargs)
