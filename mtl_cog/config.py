"""Typed, validated experiment configuration.

A run is described by nested dataclasses. ``load_config(path, overrides)`` reads a YAML file
(which may pull in others through ``_base_``), applies dotted ``key=value`` overrides, checks
every key and type, and validates values. Every error names the offending key and value, and
unknown keys suggest close matches, so a typo never silently falls back to a default.

Functions elsewhere take the sub-config they need (``DataConfig``, ``OptimConfig`` ...), never
the whole ``Config``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtl_cog.errors import UserError


class ConfigError(UserError, ValueError):
    """A user error in a config file or override; the message names key and value."""


@dataclass
class SyntheticConfig:
    """Options of the built-in ``synthetic`` task (see ``tasks/synthetic.py``)."""

    num_attributes: int = 40
    num_latents: int = 8
    train_size: int = 1000
    val_size: int = 1000
    test_size: int = 2000
    label_sharpness: float = 1.5  # scales the latent->logit map: higher = less label noise
    seed: int = 1234  # the data set's own seed, independent of the training seed

    def validate(self) -> None:
        _positive(self, "num_attributes", "num_latents", "train_size", "val_size", "test_size")
        if self.label_sharpness <= 0:
            raise ConfigError(f"data.synthetic.label_sharpness must be > 0. Got {self.label_sharpness}.")


@dataclass
class DataConfig:
    task: str = "synthetic"
    root: str = "data"
    max_samples: int | None = None  # cap per split, for quick runs
    image_size: int = 32
    download: bool = False
    cache_dir: str | None = None  # where decoded uint8 caches live; default <root>/.mtl_cog_cache
    # decode once into a memory-mapped uint8 cache (mtl_cog/cache.py); false = decode on every run
    use_cache: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def validate(self) -> None:
        if not self.task:
            raise ConfigError("data.task must name a task (see tasks/).")
        if self.max_samples is not None and self.max_samples <= 0:
            raise ConfigError(f"data.max_samples must be a positive integer or null. Got {self.max_samples}.")
        if self.image_size < 8 or self.image_size > 512:
            raise ConfigError(f"data.image_size must be in [8, 512]. Got {self.image_size}.")
        self.synthetic.validate()


@dataclass
class ModelConfig:
    backbone: str = "cog_cnn_small"  # any timm model name (our small CNNs are registered with timm)
    pretrained: bool = False
    cifar_stem: bool = False  # 3x3 stride-1 first conv, no max-pool: for 32x32 ResNets
    head: str = "linear"  # registry in mtl_cog/heads.py
    head_latent_dim: int = 0  # latent width Z of the "mlp" (TST-style) head; 0 = backbone width
    drop_rate: float = 0.0
    timm_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model

    def validate(self) -> None:
        if not self.backbone:
            raise ConfigError("model.backbone must name a timm model.")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ConfigError(f"model.drop_rate must be in [0, 1). Got {self.drop_rate}.")
        if self.head_latent_dim < 0:
            raise ConfigError(f"model.head_latent_dim must be >= 0. Got {self.head_latent_dim}.")


@dataclass
class MethodConfig:
    """What makes a method: which calibrator, which loss, and who leads.

    ``leader`` lists sub-modules of the network (``heads``, ``calibrator``) whose parameters form
    the leader group (learning rate ``optim.leader_lr``). Empty = standard training.
    """

    name: str = "cog_fc"
    calibrator: str = "identity"  # registry in mtl_cog/calibrators.py
    leader: list[str] = field(default_factory=lambda: ["heads"])
    loss: str = "ce"  # registry in mtl_cog/objectives.py
    label_smoothing: float = 0.1  # used by loss "ls"
    focal_gamma: float = 2.0  # used by loss "focal"

    def validate(self) -> None:
        allowed = {"heads", "calibrator"}
        for module in self.leader:
            if module not in allowed:
                raise ConfigError(f"method.leader entries must be among {sorted(allowed)}. Got {module!r}.")
        if len(set(self.leader)) != len(self.leader):
            raise ConfigError(f"method.leader lists a module twice: {self.leader}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"method.label_smoothing must be in [0, 1). Got {self.label_smoothing}.")
        if self.focal_gamma < 0:
            raise ConfigError(f"method.focal_gamma must be >= 0. Got {self.focal_gamma}.")


@dataclass
class OptimConfig:
    follower_lr: float = 1e-3
    leader_lr: float = 1e-4
    # COG's Stackelberg update needs the follower to adapt faster than the leader (paper, Sec. 3).
    # Setting this to true accepts leader_lr >= follower_lr on purpose (e.g. for ablations).
    allow_leader_lr_geq_follower: bool = False
    weight_decay: float = 0.0
    lr_step_epochs: int = 10  # step schedule: divide both learning rates by 1/lr_gamma every N epochs
    lr_gamma: float = 0.1

    def validate(self, has_leader: bool) -> None:
        for key in ("follower_lr", "leader_lr"):
            value = getattr(self, key)
            if value < 0 or (key == "follower_lr" and value == 0):
                raise ConfigError(f"optim.{key} must be > 0. Got {value}.")
        if has_leader and self.leader_lr >= self.follower_lr and not self.allow_leader_lr_geq_follower:
            raise ConfigError(
                f"optim.leader_lr ({self.leader_lr}) must be smaller than optim.follower_lr "
                f"({self.follower_lr}): in COG the follower adapts faster than the leader. "
                "Set optim.allow_leader_lr_geq_follower=true to run it anyway."
            )
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0. Got {self.weight_decay}.")
        if self.lr_step_epochs <= 0:
            raise ConfigError(f"optim.lr_step_epochs must be > 0. Got {self.lr_step_epochs}.")
        if not 0 < self.lr_gamma <= 1:
            raise ConfigError(f"optim.lr_gamma must be in (0, 1]. Got {self.lr_gamma}.")


PRECISIONS = ("no", "bf16", "fp16")


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_size: int = 128  # global batch: split evenly across processes
    eval_batch_size: int = 512
    log_every_steps: int = 50  # also how often a non-finite loss is looked for (one host sync)
    # Besides every epoch end, save the resumable training state every N optimiser steps; 0 = off.
    save_every_steps: int = 0
    # A NaN/inf training loss: "stop" (error naming epoch and step; the last saved state is kept)
    # or "skip" (drop that batch, no update, counted as nonfinite_skipped in metrics.jsonl).
    nonfinite: str = "stop"
    # Speed options (mtl_cog/performance.py); all off by default so CPU runs behave as before.
    precision: str = "no"  # no | bf16 | fp16: Accelerate's mixed precision (fp16 needs a GPU)
    channels_last: bool = False  # NHWC memory format for conv nets (faster tensor cores on GPUs)
    compile: bool = False  # torch.compile the network in place (nn.Module.compile)
    images_on_device: bool = False  # keep the training split's uint8 images on the GPU when they fit

    def validate(self) -> None:
        _positive(self, "epochs", "batch_size", "eval_batch_size", "log_every_steps", prefix="train")
        if self.save_every_steps < 0:
            raise ConfigError(
                f"train.save_every_steps must be >= 0 (0 = only at epoch ends). Got {self.save_every_steps}."
            )
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"train.nonfinite must be 'stop' or 'skip'. Got {self.nonfinite!r}.")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}. Got {self.precision!r}.")


@dataclass
class EvalConfig:
    bins: list[int] = field(default_factory=lambda: [5, 10, 15, 20, 50])
    selection_metric: str = "brier"  # mean over tasks on validation; lower is better

    def validate(self) -> None:
        if not self.bins or any(b <= 0 for b in self.bins):
            raise ConfigError(f"eval.bins must be a non-empty list of positive integers. Got {self.bins}.")
        if self.selection_metric not in ("brier", "nll", "accuracy"):
            raise ConfigError(
                f"eval.selection_metric must be one of brier, nll, accuracy. Got {self.selection_metric!r}."
            )


@dataclass
class TwoStageConfig:
    """TST / V-TST (Jordahn & Olmos, 2024): after stage one, freeze the backbone (in eval mode),
    put a new head on it and train only that head, early-stopped on validation NLL.

    Off by default; ``configs/methods/tst.yaml`` and ``vtst.yaml`` switch it on.
    """

    enabled: bool = False
    head: str = "mlp"  # registry in mtl_cog/heads.py: mlp (TST) or variational (V-TST)
    latent_dim: int = 64  # Z of Linear(D,3Z) -> ReLU -> Linear(3Z,Z) -> Linear(Z,K); 0 = backbone width
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 5  # stop after this many epochs without a better validation NLL
    kl_weight: float = 1e-3  # weight of the variational head's KL term (per sample, mean over tasks)
    mc_samples: int = 10  # evaluation averages the probabilities of this many samples (stochastic heads)

    def validate(self) -> None:
        _positive(self, "epochs", "patience", "mc_samples", prefix="two_stage")
        from mtl_cog.heads import HEADS  # here, not at the top: heads.py must not depend on config.py

        if self.head not in HEADS:  # checked now, not after stage one has trained for hours
            raise ConfigError(f"two_stage.head must be one of {', '.join(HEADS.names())}. Got {self.head!r}.")
        if self.lr <= 0:
            raise ConfigError(f"two_stage.lr must be > 0. Got {self.lr}.")
        if self.latent_dim < 0:
            raise ConfigError(f"two_stage.latent_dim must be >= 0. Got {self.latent_dim}.")
        if self.weight_decay < 0 or self.kl_weight < 0:
            raise ConfigError(
                f"two_stage.weight_decay and two_stage.kl_weight must be >= 0. "
                f"Got {self.weight_decay}, {self.kl_weight}."
            )


@dataclass
class Config:
    seed: int = 0
    output_dir: str = "runs"
    run_name: str | None = None  # default: <task>-<method>-seed<seed>-<timestamp>
    tracking: str = "wandb"  # wandb (offline when no credentials) | none
    wandb_project: str = "mtl_cog"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    two_stage: TwoStageConfig = field(default_factory=TwoStageConfig)

    def validate(self) -> None:
        if self.tracking not in ("wandb", "none"):
            raise ConfigError(f"tracking must be 'wandb' or 'none'. Got {self.tracking!r}.")
        if not self.output_dir:
            raise ConfigError("output_dir must not be empty.")
        self.data.validate()
        self.model.validate()
        self.method.validate()
        self.optim.validate(has_leader=bool(self.method.leader))
        self.train.validate()
        self.eval.validate()
        self.two_stage.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(obj: Any, *keys: str, prefix: str | None = None) -> None:
    for key in keys:
        value = getattr(obj, key)
        if value <= 0:
            name = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"{name} must be > 0. Got {value}.")


# --------------------------------------------------------------------------------------------
# Loading: YAML (+ _base_ includes) -> dict -> overrides -> typed dataclasses -> validate


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated ``Config`` from an optional YAML file and ``key=value`` overrides."""
    raw: dict[str, Any] = _read_yaml_with_bases(Path(path)) if path is not None else {}
    for item in overrides or []:
        key, value = _parse_override(item)
        _set_dotted(raw, key, value)
    config = _build(Config, raw, prefix="")
    config.validate()
    return config


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Rebuild a config saved with ``Config.to_dict`` (e.g. a run folder's config.yaml)."""
    config = _build(Config, raw, prefix="")
    config.validate()
    return config


def save_config(config: Config, path: Path) -> None:
    from mtl_cog.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def _read_yaml_with_bases(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"config file {path} includes itself through _base_.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level, got {type(data).__name__}.")
    bases = data.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    merged: dict[str, Any] = {}
    for base in bases:
        _deep_merge(merged, _read_yaml_with_bases(path.parent / base, _seen + (path.resolve(),)))
    _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "timm_kwargs":
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. train.epochs=3).")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key.")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key, value


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is a value, not a section.")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping. Got {raw!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3)
            hint = f" Did you mean {', '.join(prefix + c for c in close)}?" if close else ""
            raise ConfigError(f"unknown config key {prefix + str(key)!r}.{hint} Known keys here: {', '.join(names)}.")
        kwargs[key] = _coerce(hints[key], value, prefix + key)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the type hint; allow int->float; name key and value on failure."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, key + ".")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list. Got {value!r}.")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping. Got {value!r}.")
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false. Got {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer. Got {value!r}.")
        return value
    if hint is float:
        if isinstance(value, str):
            # YAML 1.1 reads "1e-5" (no dot) as a string; accept it as the number it means.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number. Got {value!r}.")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string. Got {value!r}.")
        return value
    raise ConfigError(f"{key}: unsupported type {hint}.")
