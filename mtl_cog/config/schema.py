"""The experiment configuration: nested dataclasses, their defaults and value checks.

``mtl_cog.config.loader`` turns YAML + overrides into these; each ``validate`` checks values
that make sense on their own. Names that must exist in a registry (heads, losses, calibrators,
tasks) are checked by ``mtl_cog.training.preflight`` before anything trains, since the
registries live in higher layers.

Functions elsewhere take the sub-config they need (``DataConfig``, ``OptimConfig`` ...), never
the whole ``Config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.errors import ConfigError


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
    # Neighbouring methods (docs/neighbour_methods.md). MbLS (Liu et al., 2022), authors' defaults:
    # CE + mbls_lambda * mean_j max(0, max_k z_k - z_j - mbls_margin); FedLAS+ reuses the margin.
    mbls_margin: float = 10.0  # losses "mbls", "fedlas_mbls"
    mbls_lambda: float = 0.1  # loss "mbls"
    # FedLAS (Bahavan et al.): per-sample smoothing 2*alpha*sigmoid(beta * gate * feature-norm z-score);
    # defaults = the authors' CIFAR-10 config (their running-statistics momentum is ``data.momentum``).
    fedlas_alpha: float = 0.05  # losses "fedlas", "fedlas_mbls"; 0 = cross-entropy exactly
    fedlas_beta: float = 4.0
    fedlas_momentum: float = 0.95  # weight of the *new* batch in the feature-norm running mean/std
    # Margin-aware objective (our reading of "calibration, curvature and margins"; loss "margin"):
    # CE + margin_lambda * E[exp(-margin_gamma * robust margin)] + margin_mu * E[(margin slope)^2].
    margin_lambda: float = 0.1
    margin_gamma: float = 1.0
    margin_rho: float = 0.1  # feature-perturbation radius, relative to the feature norm
    margin_mu: float = 0.01
    # LiST (Lipschitz Scaling Training): loss "margin_ce" margin (logit units), the initial Lipschitz
    # scale L, and how far L moves toward the validation-calibrated L/T after each epoch (0 = never).
    list_margin: float = 1.0
    list_init: float = 10.0
    list_rate: float = 0.5
    # Certified robust accuracy is reported at these l2 radii (pixel scale [0, 1]) for Lipschitz networks.
    certify_eps: list[float] = field(default_factory=lambda: [36 / 255, 72 / 255])

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
        for key in ("mbls_margin", "mbls_lambda", "fedlas_beta", "margin_lambda", "margin_gamma", "margin_rho",
                    "margin_mu", "list_margin"):
            if not 0 <= getattr(self, key) < float("inf"):
                raise ConfigError(f"method.{key} must be a finite number >= 0. Got {getattr(self, key)}.")
        if not 0.0 <= self.fedlas_alpha <= 0.5:  # the residual 2*alpha*sigmoid(.) must stay below 1
            raise ConfigError(f"method.fedlas_alpha must be in [0, 0.5]. Got {self.fedlas_alpha}.")
        if not 0.0 < self.fedlas_momentum <= 1.0:
            raise ConfigError(f"method.fedlas_momentum must be in (0, 1]. Got {self.fedlas_momentum}.")
        if not 0.0 < self.list_init < float("inf"):
            raise ConfigError(f"method.list_init (the initial Lipschitz scale L) must be > 0. Got {self.list_init}.")
        if not 0.0 <= self.list_rate <= 1.0:
            raise ConfigError(f"method.list_rate must be in [0, 1]. Got {self.list_rate}.")
        if any(not 0 < eps < float("inf") for eps in self.certify_eps):
            raise ConfigError(f"method.certify_eps must be positive radii. Got {self.certify_eps}.")


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
    bins: list[int] = field(default_factory=lambda: list(DEFAULT_BINS))
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
