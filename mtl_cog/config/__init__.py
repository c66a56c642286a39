"""Typed, validated experiment configuration (``schema``) and how it is read (``loader``)."""

from mtl_cog.config.loader import config_from_dict, load_config, save_config
from mtl_cog.config.schema import (
    PRECISIONS,
    Config,
    DataConfig,
    EvalConfig,
    FashionMosaicConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    SyntheticConfig,
    TrainConfig,
    TwoStageConfig,
)

__all__ = [
    "PRECISIONS", "Config", "DataConfig", "EvalConfig", "FashionMosaicConfig", "MethodConfig", "ModelConfig",
    "OptimConfig", "SyntheticConfig", "TrainConfig", "TwoStageConfig", "config_from_dict", "load_config", "save_config",
]
