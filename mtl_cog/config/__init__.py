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
    MtlConfig,
    OptimConfig,
    SyntheticConfig,
    TrainConfig,
    TwoStageConfig,
    counterpart_identity,
    method_identity,
)

__all__ = [
    "PRECISIONS", "Config", "DataConfig", "EvalConfig", "FashionMosaicConfig", "MethodConfig", "ModelConfig",
    "MtlConfig", "OptimConfig", "SyntheticConfig", "TrainConfig", "TwoStageConfig", "config_from_dict",
    "counterpart_identity", "load_config", "method_identity", "save_config",
]
