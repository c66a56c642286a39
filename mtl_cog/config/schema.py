"""The experiment configuration: nested dataclasses, their defaults and value checks.

``mtl_cog.config.loader`` turns YAML + overrides into these; each ``validate`` checks values
that make sense on their own. Names that must exist in a registry (heads, losses, calibrators,
tasks) are checked by ``mtl_cog.training.preflight`` before anything trains, since the
registries live in higher layers.

Functions elsewhere take the sub-config they need (``DataConfig``, ``OptimConfig`` ...), never
the whole ``Config``. The schema stays one file over 450 lines because it is the one place a
reader sees every key of a run's YAML, section by section in the file's own order, with its
default and its check; the loader walks it from the one root ``Config``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from mtl_cog.constants import CORRUPTIONS, DEFAULT_BINS, SEVERITIES, SHIFT_SUITES, SUMMARY_BINS
from mtl_cog.errors import ConfigError

# Adam (the optimiser of every method) moves each weight by about lr per step: above this a run can
# only diverge, and a typo (1e3 for 1e-3) should be refused before hours of training.
MAX_LEARNING_RATE = 10.0
MAX_SEED = 2**32 - 1  # numpy's and Python's seeding take [0, 2**32 - 1]
# Calibration errors with more bins than test samples measure noise; the paper reports 5..50.
# The bound keeps the per-bin arrays small however the count is given (config, --bins).
MAX_BINS = 10_000
MAX_HEAD_LATENT_DIM = 1 << 16  # the mlp head is Linear(D, 3Z): larger Z only exhausts memory


def check_seed(value: int, key: str) -> None:
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{key} must be an integer in [0, {MAX_SEED}] (2**32 - 1). Got {value}.")


def check_bins(bins: list[int], key: str) -> None:
    """A non-empty list of bin counts in [1, MAX_BINS]; used by ``eval.bins`` and the CLIs' ``--bins``."""
    if not bins or any(not 1 <= b <= MAX_BINS for b in bins):
        raise ConfigError(f"{key} must be a non-empty list of integers in [1, {MAX_BINS}]. Got {bins}.")


def check_learning_rate(value: float, key: str, zero_allowed: bool = False) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number. Got {value}.")
    if value < 0 or (value == 0 and not zero_allowed):
        raise ConfigError(f"{key} must be {'>= 0' if zero_allowed else '> 0'}. Got {value}.")
    if value > MAX_LEARNING_RATE:
        raise ConfigError(f"{key} must be <= {MAX_LEARNING_RATE} (Adam moves every weight by about that much "
                          f"per step). Got {value}.")


def check_folder_name(value: str, key: str) -> None:
    """``value`` names one folder inside its parent: no separator, not '.' or '..', printable, not too long."""
    problem = None
    if value in ("", ".", ".."):
        problem = "it must name a folder"
    elif "/" in value or (os.altsep and os.altsep in value) or os.sep in value:
        problem = "it must be a single folder name, without '/' (put the parent folder in output_dir)"
    elif any(ord(c) < 32 or ord(c) == 127 for c in value):
        problem = "it must not contain control characters (newlines, tabs, NUL)"
    elif len(value.encode()) > 255:
        problem = "it is longer than the 255 bytes a folder name may have"
    if problem:
        raise ConfigError(f"{key} {value!r} is not usable: {problem}.")


def check_path_text(value: str | None, key: str) -> None:
    if value is not None and "\0" in value:
        raise ConfigError(f"{key} must not contain a NUL character. Got {value!r}.")


@dataclass
class SyntheticConfig:
    """Options of the built-in ``synthetic`` task (see ``tasks/synthetic.py``)."""

    num_attributes: int = 40  # binary tasks (attributes), CelebA's 40 by default
    num_latents: int = 8  # hidden factors each image is drawn from and each attribute's true logit depends on
    train_size: int = 1000  # training images
    # 20% of train_size: the held-out fraction of CIFAR-10 and SVHN in the paper (App. B). Post-hoc
    # calibrators fit on it while COG calibrates on the training set, so a validation set as
    # large as the training set would favour post-hoc methods. Not derived from train_size: set
    # both when changing the training size.
    val_size: int = 200
    test_size: int = 2000  # test images: the split every reported metric is measured on
    label_sharpness: float = 1.5  # scales the latent->logit map: higher = less label noise
    seed: int = 1234  # the data set's own seed, independent of the training seed

    def validate(self) -> None:
        _positive(self, "num_attributes", "num_latents", "train_size", "val_size", "test_size")
        if self.label_sharpness <= 0:
            raise ConfigError(f"data.synthetic.label_sharpness must be > 0. Got {self.label_sharpness}.")


@dataclass
class FashionMosaicConfig:
    """Options of the ``fashion_mosaic`` task (see ``tasks/fashion_mosaic.py``): 2x2 mosaics of Fashion-MNIST items."""

    # The smallest sizes that keep a CelebA-shaped benchmark meaningful at CPU scale; validation is 20 % of train,
    # as for synthetic (post-hoc calibrators fit on it, COG on the training set).
    train_size: int = 20000
    val_size: int = 4000  # validation mosaics (post-hoc calibrators and checkpoint selection)
    test_size: int = 8000  # test mosaics
    empty_tile_probability: float = 0.3  # each tile independently; the item count is Binomial(4, 0.7)
    # true: the four binary tile_<p>_empty tasks become 11-class tile_<p>_item tasks (10 classes + empty),
    # a heterogeneous multi-task setting (binary and multi-class heads side by side)
    heterogeneous: bool = False
    seed: int = 0  # the mosaic layout's own seed, independent of the training seed

    def validate(self) -> None:
        _positive(self, "train_size", "val_size", "test_size", prefix="data.fashion_mosaic")
        if not 0.0 <= self.empty_tile_probability < 1.0:
            raise ConfigError("data.fashion_mosaic.empty_tile_probability must be in [0, 1). "
                              f"Got {self.empty_tile_probability}.")


@dataclass
class DataConfig:
    task: str = "synthetic"  # the data set: a name registered in tasks/ (synthetic, digits, fashion_mnist, ...)
    root: str = "data"  # the folder holding the data sets' files (docs/guides/data.md says where each goes)
    max_samples: int | None = None  # cap per split, for quick runs
    image_size: int = 32  # side S in pixels: every image is brought to S x S (RGB, shorter side to S, centre crop)
    # fetch the data set's files into data.root when they are missing (Fashion-MNIST, CelebA, SVHN); needs network
    download: bool = False
    cache_dir: str | None = None  # where decoded uint8 caches live; default <root>/.mtl_cog_cache
    # decode once into a memory-mapped uint8 cache (mtl_cog/data/cache.py); false = decode on every run
    use_cache: bool = True
    # Partly labelled data on demand: hide this fraction of the (sample, task) labels of every split at random
    # (they become MISSING_LABEL), drawn from hide_labels_seed, independent of the training seed (docs/guides/mtl.md).
    hide_labels: float = 0.0
    hide_labels_seed: int = 0  # seed of which labels data.hide_labels hides
    # Train on this many training images (null = all): a fixed random subset drawn by train_size_seed,
    # independent of the training seed, nested (a smaller subset is part of every larger one); validation
    # and test are untouched. A small training set is how an overparameterised network overfits on a CPU
    # budget (docs/results/overconfident.md). fashion_mosaic has its own generated size
    # (data.fashion_mosaic.train_size); this one then keeps a subset of it.
    train_size: int | None = None
    train_size_seed: int = 0  # which training images data.train_size keeps (not the training seed)
    # false: no train-time augmentation (the task's random crop and flip are off); true: the task's own
    augment: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    fashion_mosaic: FashionMosaicConfig = field(default_factory=FashionMosaicConfig)

    def validate(self) -> None:
        if not self.task:
            raise ConfigError("data.task must name a task (see tasks/).")
        if self.max_samples is not None and self.max_samples <= 0:
            raise ConfigError(f"data.max_samples must be a positive integer or null. Got {self.max_samples}.")
        if self.image_size < 8 or self.image_size > 512:
            raise ConfigError(f"data.image_size must be in [8, 512]. Got {self.image_size}.")
        check_path_text(self.root, "data.root")
        check_path_text(self.cache_dir, "data.cache_dir")
        self.synthetic.validate()
        check_seed(self.synthetic.seed, "data.synthetic.seed")
        self.fashion_mosaic.validate()
        check_seed(self.fashion_mosaic.seed, "data.fashion_mosaic.seed")
        if not 0.0 <= self.hide_labels < 1.0:
            raise ConfigError(f"data.hide_labels (the fraction of labels hidden) must be in [0, 1). "
                              f"Got {self.hide_labels}.")
        check_seed(self.hide_labels_seed, "data.hide_labels_seed")
        if self.train_size is not None and (isinstance(self.train_size, bool) or self.train_size <= 0):
            raise ConfigError(f"data.train_size must be a positive integer or null (all). Got {self.train_size}.")
        check_seed(self.train_size_seed, "data.train_size_seed")


@dataclass
class ModelConfig:
    backbone: str = "cog_cnn_small"  # any timm model name (our small CNNs are registered with timm)
    pretrained: bool = False  # start from timm's pretrained weights (refused for a model timm has none for)
    cifar_stem: bool = False  # 3x3 stride-1 first conv, no max-pool: for 32x32 ResNets
    head: str = "linear"  # registry in mtl_cog/models/heads.py
    head_latent_dim: int = 0  # latent width Z of the "mlp" (TST-style) head; 0 = backbone width
    drop_rate: float = 0.0  # dropout before the heads (timm's drop_rate); off in evaluation
    timm_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model

    def validate(self) -> None:
        if not self.backbone:
            raise ConfigError("model.backbone must name a timm model.")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ConfigError(f"model.drop_rate must be in [0, 1). Got {self.drop_rate}.")
        if not 0 <= self.head_latent_dim <= MAX_HEAD_LATENT_DIM:
            raise ConfigError(
                f"model.head_latent_dim must be in [0, {MAX_HEAD_LATENT_DIM}]. Got {self.head_latent_dim}."
            )
        if any(not isinstance(key, str) for key in self.timm_kwargs):
            raise ConfigError(f"model.timm_kwargs keys must be argument names (strings). Got {self.timm_kwargs}.")


@dataclass
class MethodConfig:
    """What makes a method: which calibrator, which loss, and who leads.

    ``leader`` lists sub-modules of the network (``heads``, ``calibrator``) whose parameters form
    the leader group (learning rate ``optim.leader_lr``). Empty = standard training.
    """

    name: str = "cog_fc"  # the method's name in run folders, tables and reports
    calibrator: str = "identity"  # registry in mtl_cog/models/calibrators.py
    # the modules that lead (heads, calibrator), trained at optim.leader_lr; [] = standard training
    leader: list[str] = field(default_factory=lambda: ["heads"])
    loss: str = "ce"  # registry in mtl_cog/objectives/base.py
    label_smoothing: float = 0.1  # used by loss "ls"
    focal_gamma: float = 2.0  # used by loss "focal"
    # The method this one is paired with in reports (the COG paper's Tab. 1: cog_ts vs baseline+ts,
    # i.e. post-hoc TS on the baseline); compare.py reports the paired differences. None = no pair.
    counterpart: str | None = None
    # Neighbouring methods (docs/explanation/neighbour_methods.md). MbLS (Liu et al., 2022), authors' defaults:
    # CE + mbls_lambda * mean_j max(0, max_k z_k - z_j - mbls_margin); FedLAS+ reuses the margin.
    mbls_margin: float = 10.0  # losses "mbls", "fedlas_mbls"
    mbls_lambda: float = 0.1  # loss "mbls"
    # FedLAS (Bahavan et al.): per-sample smoothing 2*alpha*sigmoid(beta * gate * feature-norm z-score);
    # defaults = the authors' CIFAR-10 config (their running-statistics momentum is ``data.momentum``).
    fedlas_alpha: float = 0.05  # losses "fedlas", "fedlas_mbls"; 0 = cross-entropy exactly
    fedlas_beta: float = 4.0  # the gate's slope beta: how sharply the smoothing follows the feature-norm z-score
    fedlas_momentum: float = 0.95  # weight of the *new* batch in the feature-norm running mean/std
    # Margin-aware objective (our reading of "calibration, curvature and margins"; loss "margin"):
    # CE + margin_lambda * E[exp(-margin_gamma * robust margin)] + margin_mu * E[(margin slope)^2].
    margin_lambda: float = 0.1
    margin_gamma: float = 1.0  # how fast the margin penalty exp(-gamma * margin) falls as the margin grows
    margin_rho: float = 0.1  # feature-perturbation radius, relative to the feature norm
    margin_mu: float = 0.01  # weight of the squared margin slope (a curvature penalty)
    # LiST (Lipschitz Scaling Training): loss "margin_ce" margin (logit units), the initial Lipschitz
    # scale L, and how far L moves toward the validation-calibrated L/T after each epoch (0 = never).
    list_margin: float = 1.0
    list_init: float = 10.0  # the Lipschitz scale L at the start of training
    list_rate: float = 0.5  # the fraction of the way from L to L/T taken after each epoch
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
    follower_lr: float = 1e-3  # Adam's learning rate of the follower: every parameter not in method.leader
    # Adam's learning rate of the leader (the modules in method.leader); smaller than follower_lr; 0 = frozen
    leader_lr: float = 1e-4
    # COG's Stackelberg update needs the follower to adapt faster than the leader (paper, Sec. 3).
    # Setting this to true accepts leader_lr >= follower_lr on purpose (e.g. for ablations).
    allow_leader_lr_geq_follower: bool = False
    weight_decay: float = 0.0  # Adam's L2 penalty, on the leader and the follower alike
    lr_step_epochs: int = 10  # step schedule: divide both learning rates by 1/lr_gamma every N epochs
    lr_gamma: float = 0.1  # the step schedule's factor: both learning rates are multiplied by it every lr_step_epochs
    # Epochs after which both learning rates are multiplied by lr_gamma (torch's MultiStepLR), e.g. [20, 25] at 30
    # epochs; set, it replaces the every-lr_step_epochs schedule, so lr_step_epochs must then be left at a period no
    # run reaches (the paper protocol's late-steps arm, mtl_cog/experiments/protocol.py). Empty: the step schedule.
    lr_milestones: list[int] = field(default_factory=list)

    def validate(self, has_leader: bool) -> None:
        check_learning_rate(self.follower_lr, "optim.follower_lr")
        check_learning_rate(self.leader_lr, "optim.leader_lr", zero_allowed=True)  # 0 = a frozen leader
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
        if self.lr_milestones:
            if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.lr_milestones) \
                    or list(self.lr_milestones) != sorted(set(self.lr_milestones)):
                raise ConfigError("optim.lr_milestones must be increasing whole epochs >= 1. "
                                  f"Got {self.lr_milestones}.")
            if self.lr_step_epochs <= self.lr_milestones[-1]:  # two schedules at once: one would silently win
                raise ConfigError(f"optim.lr_milestones {self.lr_milestones} replace the step schedule, but "
                                  f"optim.lr_step_epochs={self.lr_step_epochs} would also step the rates: set "
                                  "optim.lr_step_epochs=1000000 (no step) with milestones, or leave lr_milestones out.")


PRECISIONS = ("no", "bf16", "fp16")
DEFAULT_DIST_TIMEOUT_S = 1800  # torch's own default for gloo (30 min); for NCCL torch would take 10 min
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600  # a bound that still ends a wait for a process that is gone


@dataclass
class TrainConfig:
    epochs: int = 30  # training epochs; the epoch with the best eval.selection_metric on validation is kept
    batch_size: int = 128  # global batch: split evenly across processes
    eval_batch_size: int = 512  # images per forward pass when predicting validation and test (no gradients)
    log_every_steps: int = 50  # also how often a non-finite loss is looked for (one host sync)
    # Besides every epoch end, save the resumable training state every N optimiser steps; 0 = off.
    save_every_steps: int = 0
    # A NaN/inf training loss: "stop" (error naming epoch and step; the last saved state is kept)
    # or "skip" (drop that batch, no update, counted as nonfinite_skipped in metrics.jsonl).
    nonfinite: str = "stop"
    # Speed options (mtl_cog/training/speed.py); all off by default so CPU runs behave as before.
    precision: str = "no"  # no | bf16 | fp16: Accelerate's mixed precision (fp16 needs a GPU)
    channels_last: bool = False  # NHWC memory format for conv nets (faster tensor cores on GPUs)
    compile: bool = False  # torch.compile the network in place (nn.Module.compile)
    images_on_device: bool = False  # keep the training split's uint8 images on the GPU when they fit
    # Several processes: how long a collective (or the main process building a data cache alone) may wait for
    # another process before this one gives up with an error; a machine that vanishes without closing its
    # connections is noticed after this long (docs/guides/failure_paths.md).
    dist_timeout_s: int = DEFAULT_DIST_TIMEOUT_S

    def validate(self) -> None:
        _positive(self, "epochs", "batch_size", "eval_batch_size", "log_every_steps", prefix="train")
        if self.save_every_steps < 0:
            raise ConfigError(
                f"train.save_every_steps must be >= 0 (0 = only at epoch ends). Got {self.save_every_steps}."
            )
        if not 1 <= self.dist_timeout_s <= MAX_DIST_TIMEOUT_S:
            raise ConfigError(f"train.dist_timeout_s must be between 1 and {MAX_DIST_TIMEOUT_S} seconds (a week): a "
                              f"bounded wait for another process. Got {self.dist_timeout_s}.")
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"train.nonfinite must be 'stop' or 'skip'. Got {self.nonfinite!r}.")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}. Got {self.precision!r}.")


@dataclass
class EvalConfig:
    # bin counts of the binned calibration errors (ECE, MCE, ...); must include 15, the count summaries show
    bins: list[int] = field(default_factory=lambda: list(DEFAULT_BINS))
    selection_metric: str = "brier"  # mean over tasks on validation; lower is better
    # Also predict validation and test with the last epoch's network (predictions_<split>_last.npz): the
    # "last epoch" checkpoint rule beside the selected one, at the cost of one more pass over both splits.
    score_last_epoch: bool = False
    # k most correlated attribute pairs scored by pair_joint_ece (docs/explanation/metrics.md); 0 = none
    joint_pairs: int = 10
    # task names whose label values define subgroups: per-group metrics, multicalibration (group_metrics.csv)
    groups: list[str] = field(default_factory=list)
    # corruptions scored on the test split at the end of training ([] = none, [all] = all 15; docs/guides/shift.md)
    shift: list[str] = field(default_factory=list)
    shift_severities: list[int] = field(default_factory=lambda: list(SEVERITIES))  # which of the levels 1..5 to score
    shift_seed: int = 0  # the corruptions' random draws: the same corrupted images for every run
    shift_posthoc: list[str] = field(default_factory=list)  # post-hoc calibrators (fitted on clean val) under shift
    shift_workers: int = 0  # processes that corrupt images when a corrupted split is built; 0 = every CPU
    # whose severity parameters: cifar10c (CIFAR-10-C's script) | imagenetc (ImageNet-C's) | auto (cifar10c for
    # pictures <= 64 px, imagenetc above; docs/guides/shift.md)
    shift_suite: str = "auto"

    def validate(self) -> None:
        check_bins(self.bins, "eval.bins")
        if self.shift_suite not in ("auto", *SHIFT_SUITES):
            raise ConfigError(f"eval.shift_suite must be one of auto, {', '.join(SHIFT_SUITES)}. "
                              f"Got {self.shift_suite!r}.")
        self.shift = check_corruptions(self.shift, "eval.shift")
        check_severities(self.shift_severities, "eval.shift_severities")
        check_seed(self.shift_seed, "eval.shift_seed")
        if self.shift_workers < 0:
            raise ConfigError(f"eval.shift_workers must be >= 0 (0 = every CPU). Got {self.shift_workers}.")
        if SUMMARY_BINS not in self.bins:  # the console line, summaries and figures show ECE at this bin count
            raise ConfigError(f"eval.bins must include {SUMMARY_BINS} (the bin count every summary reports). "
                              f"Got {self.bins}; add {SUMMARY_BINS}.")
        if self.joint_pairs < 0:
            raise ConfigError(f"eval.joint_pairs must be an integer >= 0. Got {self.joint_pairs!r}.")
        if self.selection_metric not in ("brier", "nll", "accuracy"):
            raise ConfigError(
                f"eval.selection_metric must be one of brier, nll, accuracy. Got {self.selection_metric!r}."
            )


def check_corruptions(names: list[str], key: str) -> list[str]:
    """Known corruption names (``all`` = the 15), each once -> the list in the benchmark's order."""
    import difflib

    if list(names) == ["all"]:
        return list(CORRUPTIONS)
    for name in names:
        if name not in CORRUPTIONS:
            close = difflib.get_close_matches(str(name), CORRUPTIONS, n=2)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{key}: unknown corruption {name!r}.{hint} Known: all, {', '.join(CORRUPTIONS)}.")
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}: {list(names)} names a corruption twice.")
    return list(names)


def check_severities(values: list[int], key: str) -> None:
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v not in SEVERITIES for v in values):
        raise ConfigError(f"{key}: severities are integers in 1..5 (Hendrycks & Dietterich's levels). Got {values!r}.")
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}: {values} names a severity twice.")


@dataclass
class TwoStageConfig:
    """TST / V-TST (Jordahn & Olmos, 2024): after stage one, freeze the backbone (in eval mode),
    put a new head on it and train only that head, keeping its epoch with the best validation NLL.

    The defaults are the authors' (their public code, ``MJordahn/Decoupled-Layers-for-Calibrated-NNs``):
    Adam with learning rate 1e-4 for 40 epochs, the best validation checkpoint kept and no early
    stopping, latent size Z = 10 (their code's default; their README's example uses 256), and
    for V-TST a KL weight of 1 on the batch mean of sum_d KL_d / Z. docs/explanation/baselines.md lists what
    we could not match. Off by default; ``configs/methods/tst.yaml`` and ``vtst.yaml`` switch it on.
    """

    enabled: bool = False  # true: train stage two (a new head on the frozen backbone) after stage one
    head: str = "mlp"  # registry in mtl_cog/models/heads.py: mlp (TST) or variational (V-TST)
    latent_dim: int = 10  # Z of Linear(D,3Z) -> ReLU -> Linear(3Z,Z) -> Linear(Z,K); 0 = backbone width
    epochs: int = 40  # stage two's epochs (its best validation-NLL epoch is kept)
    lr: float = 1e-4  # Adam
    weight_decay: float = 0.0  # Adam's L2 penalty on the new head
    patience: int | None = None  # stop after this many epochs without a better validation NLL; null = never
    kl_weight: float = 1.0  # weight of the variational head's per-task KL term (batch mean of sum_d KL_d / Z)
    mc_samples: int = 10  # evaluation averages the probabilities of this many samples (stochastic heads)

    def validate(self) -> None:
        _positive(self, "epochs", "mc_samples", prefix="two_stage")
        if self.patience is not None and self.patience <= 0:
            raise ConfigError(
                f"two_stage.patience must be > 0 or null (no early stopping). Got {self.patience}."
            )
        if self.lr <= 0:
            raise ConfigError(f"two_stage.lr must be > 0. Got {self.lr}.")
        if self.latent_dim < 0:
            raise ConfigError(f"two_stage.latent_dim must be >= 0. Got {self.latent_dim}.")
        if self.weight_decay < 0 or self.kl_weight < 0:
            raise ConfigError(
                f"two_stage.weight_decay and two_stage.kl_weight must be >= 0. "
                f"Got {self.weight_decay}, {self.kl_weight}."
            )


AGGREGATE_ON = ("features", "parameters")
EQUAL_WEIGHTS = "equal"


def method_identity(config: dict[str, Any]) -> str:
    """What a run compares as: ``method.name``, plus ``+<aggregator>`` under a multi-task aggregator
    (``cog_fc+upgrad``; ``cog_fc+mgda_params`` with the Gramian on the parameters). Read from a config
    *dict* (``Config.to_dict()`` or a run folder's ``config.yaml``), so runs older than ``mtl:`` are plain."""
    name = str(config["method"]["name"])
    mtl = config.get("mtl") or {}
    aggregator = mtl.get("aggregator", EQUAL_WEIGHTS)
    if aggregator == EQUAL_WEIGHTS:
        return name
    return f"{name}+{aggregator}" + ("_params" if mtl.get("aggregate_on") == "parameters" else "")


def counterpart_identity(counterpart: str, config: dict[str, Any]) -> str:
    """A method's ``counterpart`` under the same aggregator: ``baseline+ts`` of ``cog_ts+upgrad`` is
    ``baseline+upgrad+ts`` (the baseline trained with UPGrad, then post-hoc TS): a pair differs in COG only."""
    own = method_identity(config)
    suffix = own[len(str(config["method"]["name"])):]  # "" under equal weights
    base, plus, posthoc = counterpart.partition("+")
    return f"{base}{suffix}{plus}{posthoc}"


@dataclass
class MtlConfig:
    """How the per-task losses become the shared backbone's gradient (docs/guides/mtl.md).

    ``aggregator``: ``equal`` (the mean of the per-task losses: plain training, bit for bit) or a
    name registered in ``mtl_cog/objectives/aggregators/`` (uncertainty, upgrad, mgda, pcgrad,
    imtl_g, aligned_mtl). ``aggregate_on``: where the Gramian of the per-task gradients is taken,
    ``features`` (the backbone's output: one cheap Jacobian through the heads; a representation-level
    heuristic, whose weights keep the aggregator's property at the features, not at the backbone's
    parameters; Sener & Koltun's MGDA-UB bound covers MGDA only) or ``parameters`` (the backbone's
    parameters: exact, the T per-task gradients through the backbone). The heads and the COG leader
    get the mean loss's gradient either way; ``conflict_every``: see ``mtl/conflict_rate``.
    """

    # equal (the mean loss) or an aggregator of mtl_cog/objectives/aggregators/ (upgrad, mgda, pcgrad, ...)
    aggregator: str = EQUAL_WEIGHTS
    # where the per-task gradients' Gramian is taken: features (cheap, a heuristic) or parameters (exact)
    aggregate_on: str = "features"
    # features: check every this many steps whether some task's loss rises to first order under the backbone's
    # update (mtl/conflict_rate; one forward-mode product, ~1.7 steps of work); 0 = never. Parameters: every step
    conflict_every: int = 10

    def validate(self) -> None:
        if not self.aggregator:
            raise ConfigError("mtl.aggregator must name an aggregator (equal, uncertainty, upgrad, mgda, ...).")
        if self.aggregate_on not in AGGREGATE_ON:
            raise ConfigError(f"mtl.aggregate_on must be one of {', '.join(AGGREGATE_ON)}. Got {self.aggregate_on!r}.")
        if isinstance(self.conflict_every, bool) or self.conflict_every < 0:
            raise ConfigError(f"mtl.conflict_every must be >= 0 (0 = never check on the features). "
                              f"Got {self.conflict_every!r}.")


@dataclass
class Config:
    seed: int = 0  # the training seed: initial weights, batch order, augmentation, dropout
    output_dir: str = "runs"  # the folder in which each run creates its own folder
    run_name: str | None = None  # default: <task>-<method>-seed<seed>-<timestamp>
    tracking: str = "wandb"  # wandb (offline when no credentials) | none
    wandb_project: str = "mtl_cog"  # the W&B project runs are logged to (docs/guides/tracking.md)
    wandb_group: str | None = None  # W&B group: the runs of one sweep / reproduction share it (docs/guides/tracking.md)
    wandb_job_type: str | None = None  # W&B job_type, e.g. "sweep" or "reproduce"; None = W&B's default
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    two_stage: TwoStageConfig = field(default_factory=TwoStageConfig)
    mtl: MtlConfig = field(default_factory=MtlConfig)

    def validate(self) -> None:
        if self.tracking not in ("wandb", "none"):
            raise ConfigError(f"tracking must be 'wandb' or 'none'. Got {self.tracking!r}.")
        if not self.output_dir:
            raise ConfigError("output_dir must not be empty.")
        check_path_text(self.output_dir, "output_dir")
        if self.run_name is not None:  # a single folder name: a run never writes outside output_dir
            check_folder_name(self.run_name, "run_name")
        check_seed(self.seed, "seed")
        for key in ("wandb_group", "wandb_job_type"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"{key} must be a non-empty string or null. Got {value!r}.")
        self.data.validate()
        self.model.validate()
        self.method.validate()
        self.optim.validate(has_leader=bool(self.method.leader))
        self.train.validate()
        self.eval.validate()
        self.two_stage.validate()
        self.mtl.validate()
        if self.optim.lr_milestones and self.optim.lr_milestones[-1] >= self.train.epochs:  # a step never taken
            raise ConfigError(f"optim.lr_milestones {self.optim.lr_milestones}: a step after epoch "
                              f"{self.optim.lr_milestones[-1]} never happens in a run of train.epochs="
                              f"{self.train.epochs}; give milestones below the epoch count.")
        if self.eval.score_last_epoch and self.two_stage.enabled:  # the last epoch would lack the second stage
            raise ConfigError("eval.score_last_epoch scores stage one's last network, which TST / V-TST replace with "
                              "a second-stage head: it would name a network the method never trains. Leave it off "
                              "with two_stage.enabled.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(obj: Any, *keys: str, prefix: str | None = None) -> None:
    for key in keys:
        value = getattr(obj, key)
        if value <= 0:
            name = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"{name} must be > 0. Got {value}.")
