"""The fair comparison protocol: the same tuning budget for every method, then seeds of the chosen setting.

Why: a comparison in which one method's learning rates were tuned and its competitors' were not
measures the tuning, not the method (COG-FC once got 4x the baseline's follower rate).
So, per data set and method (``scripts/reproduce.py --protocol fair``):

1. **Tune** with ``budget`` trials (seed ``TUNE_SEED``, never one of the evaluation seeds, so the
   chosen setting is not also the lucky seed it was chosen on). The knobs are
   - ``optim.follower_lr`` for *every* method, baseline included, log-uniform in
     [f0 / 10, 10 f0] around the data set's configured follower rate f0 (the same range for all);
   - for methods with a Stackelberg leader (COG variants) also the leader/follower ratio,
     log-uniform in [1e-3, 1] (``leader_ratio``; ``optim.leader_lr`` = ratio x follower). Ratio 1
     is no hierarchy (COG-FC: the baseline, step for step): it is inside the range so that a method
     whose best setting is "no hierarchy" says so instead of sitting at the range's edge. (The
     former range [1/30, 1/2] and [f0/2, 4 f0]: every head-leader variant chose the top of both.)
   - the method's own knob, by loss (``LOSS_KNOBS``): label smoothing epsilon in [0.02, 0.2] (LS,
     COG+LS), focal gamma in [1, 4] (focal), MbLS margin m in [2, 20] (MbLS, COG+MbLS), FedLAS
     alpha in [0.01, 0.2] (FedLAS, FedLAS+, COG+FedLAS), the margin-aware weight lambda in
     [0.01, 1] (log; margin, COG+margin).
   - for two-stage methods (TST, V-TST) the second stage's learning rate ``two_stage.lr``,
     log-uniform in [1e-4, 1e-2]: the authors' 1e-4 is the lower end. Their 40 epochs at 1e-4 are
     ~31k Adam steps on CIFAR but 680 on the CPU-scale digits, where the fresh head was still
     falling linearly at epoch 40 (validation NLL 2.30 -> 0.99, baseline's 0.014): without this
     knob TST would be judged unfinished. Their first stage is tuned like the baseline's.

   The trials are an Optuna study (``mtl_cog/experiments/tuning.py``): its first ones are the
   first points of a scrambled Halton sequence (``trial_settings``; ``scipy.stats.qmc``, fixed
   seed), evenly spread for any budget and dimension, whose first coordinate, the follower rate,
   takes the *same* values for every method; then TPE (seeded) proposes the rest.
   Start values are rounded to two significant digits (readable in configs and tables).
2. **Select** the setting with the lowest validation NLL (mean over tasks) of its best
   checkpoint, the COG paper's criterion (App. B).
3. **Evaluate**: ``seeds`` runs (default 0-4, the paper's five) of the chosen setting; post-hoc calibrators are
   fitted on the baseline runs; ``scripts/compare.py`` writes the report, which pairs each COG
   variant with its counterpart (``method.counterpart``) and says which runs did not converge
   (``mtl_cog.bundles.trajectories.convergence``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import qmc

from mtl_cog.config import Config
from mtl_cog.config.search_ranges import EDGE_SHARE, Knob, range_edges  # noqa: F401 (the protocol's words)
from mtl_cog.errors import UserError
from mtl_cog.models.calibrators import CALIBRATORS

TUNE_SEED = 1000
SAMPLER_SEED = 0
FOLLOWER_RANGE = (0.1, 10.0)  # x the data set's configured follower rate (the former 0.5-4x range bound every choice)
LEADER_RATIO = (1e-3, 1.0)  # leader_lr = ratio x follower_lr; 1 = no hierarchy
LEADER_RATIO_KEY = "leader_ratio"  # the knob's name in a study (resolved into optim.leader_lr)
ALLOW_EQUAL = "optim.allow_leader_lr_geq_follower"  # the schema refuses leader >= follower without it


def widened(knob: Knob, side: str) -> Knob | None:
    """``knob`` with its range extended past the edge its choice sat at (``lowest``/``highest``): ten times
    for a log knob, half the width for a linear one, within [floor, ceiling]. None: that edge is the knob's
    limit (a leader ratio of 1 is "no hierarchy", the top of COG's range, never widened)."""
    if side == "highest" and knob.key == LEADER_RATIO_KEY:
        return None
    if knob.log:
        low, high = (knob.low / 10, knob.high) if side == "lowest" else (knob.low, knob.high * 10)
    else:
        width = (knob.high - knob.low) / 2
        low, high = (knob.low - width, knob.high) if side == "lowest" else (knob.low, knob.high + width)
    low, high = max(low, knob.floor), min(high, knob.ceiling)
    if (low, high) == (knob.low, knob.high):
        return None
    return Knob(knob.key, round_significant(low), round_significant(high), knob.log, knob.floor, knob.ceiling)


# A loss with a hyperparameter of its own: one entry here puts it into the tuning.
# Ranges: around the authors' defaults, wide enough to contain the values their papers report.
# LiST's loss (margin_ce) has none: its margin is the robustness target the user asks for, not a
# calibration knob (validation NLL would always pick the smallest), and L is fitted on validation.
LOSS_KNOBS = {
    "ls": Knob("method.label_smoothing", 0.02, 0.2, log=False, floor=0.001, ceiling=0.5),
    "focal": Knob("method.focal_gamma", 1.0, 4.0, log=False, floor=0.1),
    "mbls": Knob("method.mbls_margin", 2.0, 20.0, log=False, floor=0.1),  # MbLS: m = 10 default, tuned on validation
    "fedlas": Knob("method.fedlas_alpha", 0.01, 0.2, log=False, floor=0.001, ceiling=1.0),  # FedLAS: 0.05 / 0.1
    "fedlas_mbls": Knob("method.fedlas_alpha", 0.01, 0.2, log=False, floor=0.001, ceiling=1.0),  # FedLAS+: 0.1
    "margin": Knob("method.margin_lambda", 0.01, 1.0, log=True),  # ours: 0.1 default
}


STAGE_TWO_KNOB = Knob("two_stage.lr", 1e-4, 1e-2, log=True)  # TST / V-TST's own knob (module docstring)


def search_space(cfg: Config, base_follower_lr: float, own_knobs: bool = True) -> list[Knob]:
    """The knobs tuned for the method of ``cfg`` (see the module docstring); ``own_knobs`` False: the two learning
    rates alone (the paper's protocol: its label smoothing stays at 0.1)."""
    knobs = [Knob("optim.follower_lr", base_follower_lr * FOLLOWER_RANGE[0], base_follower_lr * FOLLOWER_RANGE[1],
                  log=True)]
    if cfg.method.leader:
        knobs.append(Knob(LEADER_RATIO_KEY, *LEADER_RATIO, log=True, ceiling=1.0))
    if not own_knobs:
        return knobs
    if cfg.method.loss in LOSS_KNOBS:
        knobs.append(LOSS_KNOBS[cfg.method.loss])
    if cfg.two_stage.enabled:
        knobs.append(STAGE_TWO_KNOB)
    return knobs


def round_significant(value: float, digits: int = 2) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits - 1}e}")


# Tuning runs per (data set, method): each is a whole training run, so thousands are already
# weeks of compute; the bound keeps a typo (1e9) from allocating the points before anything says so.
MAX_BUDGET = 10_000
# Tuning draw d samples with SAMPLER_SEED + SAMPLER_DRAW_STEP x (d - 1). A worker re-seeds TPE before every trial
# with seed + <trials so far> (tuning.reseed), so seeds one apart (the rule until 2026-12-03) gave draw 2 after
# n trials draw 1's random stream after n + 1: the draws shared TPE's candidates drawn from the prior, and on
# full Fashion-MNIST COG+LS's draw 2 proposed draw 1's sixth trial to 16 digits. A step far above any study's
# trial count (retries and widened re-tunings included) keeps the draws' streams apart.
SAMPLER_DRAW_STEP = 1_000_000


def sampler_seed(draw: int) -> int:
    """The sampler seed of tuning draw ``draw`` (1, 2, ...): its Halton scramble and its TPE stream."""
    return SAMPLER_SEED + SAMPLER_DRAW_STEP * (draw - 1)


def trial_settings(knobs: list[Knob], budget: int, seed: int = SAMPLER_SEED,
                   rotation: int | None = None) -> list[dict[str, float]]:
    """``budget`` settings: scrambled Halton points mapped onto the knobs' ranges, leader ratio resolved."""
    return [resolve(point) for point in start_points(knobs, budget, seed, rotation)]


# The random shift of a draw's start points comes from its own stream, keyed by the sampler seed and the study's
# re-tuning index, so that it is independent of the Halton scramble and of TPE's stream (same seed, other keys).
ROTATION_STREAM = 20261204


def rotation_shift(dimensions: int, seed: int, rotation: int) -> np.ndarray:
    """The Cranley-Patterson shift (one uniform number per knob) of the study with sampler ``seed`` and re-tuning
    index ``rotation`` (0 for a first tuning, 1, 2, ... for a re-tuning over widened ranges)."""
    return np.random.default_rng([ROTATION_STREAM, seed, rotation]).random(dimensions)


def start_points(knobs: list[Knob], budget: int, seed: int = SAMPLER_SEED,
                 rotation: int | None = None) -> list[dict[str, float]]:
    """``budget`` scrambled Halton points on the knobs' ranges, {knob key: value}, the ratio unresolved.

    ``rotation`` (None: no shift) adds a uniformly random shift modulo 1 to every point (a Cranley-Patterson
    rotation, ``rotation_shift``): the points stay evenly spread, and two draws' points are independent. A
    scramble alone is not enough: scrambled Halton points of different seeds keep their leading digits in the
    first dimension (base 2), so two draws' first points differed in their follower rate by a few hundredths
    of the unit interval (0.097 / 0.597 / 0.349 against 0.057 / 0.557 / 0.301), the same start in effect.
    """
    if not 1 <= budget <= MAX_BUDGET:  # before the points are drawn: 1e9 of them is a MemoryError
        raise UserError(f"--budget must be in [1, {MAX_BUDGET}]. Got {budget}.")
    points = qmc.Halton(len(knobs), scramble=True, seed=seed).random(budget)
    if rotation is not None:
        points = (points + rotation_shift(len(knobs), seed, rotation)) % 1.0
    settings = []
    for point in points:
        values = {}
        for knob, u in zip(knobs, point):
            if knob.log:
                value = math.exp(math.log(knob.low) + u * (math.log(knob.high) - math.log(knob.low)))
            else:
                value = knob.low + u * (knob.high - knob.low)
            values[knob.key] = min(max(round_significant(value), knob.low), knob.high)
        settings.append(values)
    return settings


def resolve(values: dict[str, float]) -> dict[str, float]:
    """Knob values -> config values: the leader ratio becomes ``optim.leader_lr`` (ratio x follower)."""
    values = dict(values)
    if LEADER_RATIO_KEY in values:
        ratio = values.pop(LEADER_RATIO_KEY)
        follower = values["optim.follower_lr"]
        values["optim.leader_lr"] = follower if ratio >= 1 else round_significant(ratio * follower)
    return values


def as_overrides(setting: dict[str, float]) -> list[str]:
    """Config overrides of a resolved setting; a leader as fast as its follower (ratio 1) is allowed explicitly."""
    overrides = [f"{key}={value:g}" for key, value in setting.items()]
    if setting.get("optim.leader_lr", 0.0) >= setting.get("optim.follower_lr", math.inf):
        overrides.append(f"{ALLOW_EQUAL}=true")
    return overrides


def fits_on_validation(cfg: Config) -> bool:
    """Whether training fits part of the network on the validation split (LiST's L: ``on_validation_end``).

    Such a method's validation metrics are in-sample: its tuning value and its checkpoint choice
    are optimistic next to the other methods' (its test metrics are not affected). The report
    marks them (``val_in_sample``) rather than hiding the method.
    """
    return cfg.method.calibrator in CALIBRATORS and hasattr(CALIBRATORS.get(cfg.method.calibrator),
                                                            "on_validation_end")


# ------------------------------------------------------------------------------------------ the paper's protocol
# ``reproduce --protocol paper``: the COG paper's procedure as published (App. B), beside the fair one, so that the
# share of its gains that comes from its asymmetry can be measured. What the paper says:
# - COG variants: their two learning rates tuned on validation cross-entropy, a step schedule dividing the rates by
#   10 every 10 epochs of 300 (single task) and every 3 of 100 on CelebA (multi-task), Adam;
# - the baseline: Adam at 1e-4, not tuned; label smoothing 0.1 in all cases (LS and COG+LS), not tuned;
# - the checkpoint with the best validation Brier; post-hoc TS by Guo et al.'s recipe.
# What it leaves unsaid, decided here once: the step schedule is named for "the COG experiments", so the untuned
# methods keep a constant rate; the schedule's period is scaled to the run's epoch count (1/30 of the epochs for
# one task, 3/100 for several: every epoch at 30 epochs), at least one epoch; post-hoc TS is reported both by
# Guo's recipe (``ts_guo``) and at its exact optimum (``ts``).
PAPER_BASELINE_LR = 1e-4
PAPER_LABEL_SMOOTHING = 0.1
PAPER_STEP_SHARE = {False: 10 / 300, True: 3 / 100}  # multi-task? -> decay period as a share of the epochs
CONSTANT_RATE_EPOCHS = 1_000_000  # a step period no run reaches: a constant rate


# The COG variants' rate schedule under the paper protocol (``reproduce --paper-schedule``). The paper's schedule is
# for a long live phase, then annealing: at its own scale the rate stays within 1/10 of its start for ~3,100 steps
# (CIFAR-10, batch 256) to ~3,800 (CelebA), longer than its networks need to reach their best validation NLL.
# Scaled by its epoch *fraction* to a 30-epoch CPU run (``scaled_period``: /10 every epoch) that phase is 2 epochs
# (40-80 steps here), and COG's leader barely moves: the schedule then tests the schedule, not COG. The two arms
# that keep what it is for (decided in docs/results/overconfident-plan.md, amendment 1):
# - ``constant``: no step at all (the paper's first step comes after more steps than a whole run here);
# - ``late_steps``: /10 after 2/3 and again after 5/6 of the epochs (a live phase of 5/6 of the run, then annealing).
PAPER_SCHEDULES = ("scaled_period", "constant", "late_steps")
LATE_STEP_SHARES = (2 / 3, 5 / 6)
LIVE_SHARE = 0.1  # a step is "live" while the rate is at least this share of its first value


def schedule_overrides(schedule: str, epochs: int, multitask: bool) -> list[str]:
    """The overrides of paper schedule ``schedule`` (``PAPER_SCHEDULES``) for a run of ``epochs`` epochs."""
    if schedule == "scaled_period":
        return [f"optim.lr_step_epochs={paper_step_epochs(epochs, multitask)}", "optim.lr_gamma=0.1"]
    if schedule == "constant":
        return [f"optim.lr_step_epochs={CONSTANT_RATE_EPOCHS}"]
    if schedule == "late_steps":
        milestones = sorted({max(1, math.floor(epochs * share + 0.5)) for share in LATE_STEP_SHARES})
        if milestones[-1] >= epochs:
            raise UserError(f"--paper-schedule late_steps needs at least 3 epochs (steps after 2/3 and 5/6 of them); "
                            f"the runs have {epochs}.")
        return [f"optim.lr_milestones=[{','.join(map(str, milestones))}]", "optim.lr_gamma=0.1",
                f"optim.lr_step_epochs={CONSTANT_RATE_EPOCHS}"]
    raise UserError(f"--paper-schedule {schedule!r}: choose one of {', '.join(PAPER_SCHEDULES)}.")


def live_epochs(cfg: Config) -> int:
    """Epochs whose rate is at least ``LIVE_SHARE`` of the first epoch's under ``cfg``'s schedule."""
    optim = cfg.optim
    live = 0
    for epoch in range(cfg.train.epochs):  # the rate of epoch e+1 is gamma^(steps taken after e epochs)
        steps = sum(m <= epoch for m in optim.lr_milestones) if optim.lr_milestones else epoch // optim.lr_step_epochs
        if optim.lr_gamma ** steps >= LIVE_SHARE * (1 - 1e-9):
            live += 1
    return live


PAPER_LIVE_STEPS = "~3,100 (CIFAR-10, batch 256) to ~3,800 (CelebA)"  # the paper's schedule, steps at >= 1/10


def live_steps_text(cfg: Config, train_images: int) -> str:
    """The dry run's line on ``cfg``'s live phase next to the paper's (no last partial batch is dropped)."""
    live = live_epochs(cfg)
    steps = live * math.ceil(train_images / cfg.train.batch_size)
    return (f"rate within 1/10 of its start for {live} of {cfg.train.epochs} epochs = {steps:,} steps "
            f"(the paper's schedule: {PAPER_LIVE_STEPS})")


def paper_step_epochs(epochs: int, multitask: bool) -> int:
    """The paper's decay period scaled to ``epochs`` (see above), at least one epoch."""
    return max(1, math.floor(epochs * PAPER_STEP_SHARE[multitask] + 0.5))  # half up: 75 epochs -> 3, not 2


def paper_overrides(cfg: Config, multitask: bool, schedule: str = "scaled_period") -> list[str]:
    """The paper protocol's fixed settings for the method of ``cfg`` (its tuned ones come from its study); the COG
    variants' rate schedule is ``schedule`` (``PAPER_SCHEDULES``)."""
    smoothing = [f"method.label_smoothing={PAPER_LABEL_SMOOTHING:g}"] if cfg.method.loss == "ls" else []
    if cfg.method.leader:
        return [*schedule_overrides(schedule, cfg.train.epochs, multitask), *smoothing]
    return [f"optim.follower_lr={PAPER_BASELINE_LR:g}", f"optim.lr_step_epochs={CONSTANT_RATE_EPOCHS}", *smoothing]


def is_tuned(cfg: Config, protocol_name: str) -> bool:
    """Whether ``protocol_name`` tunes the method of ``cfg``: every method under the fair protocol, the methods with
    a leader (the COG variants) under the paper's."""
    return protocol_name == "fair" or (protocol_name == "paper" and bool(cfg.method.leader))
