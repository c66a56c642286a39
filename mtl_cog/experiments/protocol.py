"""The fair comparison protocol: the same tuning budget for every method, then seeds of the chosen setting.

Why: a comparison in which one method's learning rates were tuned and its competitors' were not
measures the tuning, not the method (issue: COG-FC once got 4x the baseline's follower rate).
So, per data set and method (``scripts/reproduce.py --protocol fair``):

1. **Tune** with ``budget`` runs (seed ``TUNE_SEED``, never one of the evaluation seeds, so the
   chosen setting is not also the lucky seed it was chosen on). The knobs are
   - ``optim.follower_lr`` for *every* method, baseline included, log-uniform in
     [f0 / 2, 4 f0] around the data set's configured follower rate f0 (the same range for all);
   - for methods with a Stackelberg leader (COG variants) also ``optim.leader_lr``, drawn as a
     ratio of the follower's, log-uniform in [1/30, 1/2], so the leader stays slower (the
     hierarchy COG needs) and a calibrator leader can move (1e-4 left temperatures at ~1.00);
   - the method's own knob, by loss (``LOSS_KNOBS``): label smoothing epsilon in [0.02, 0.2] (LS,
     COG+LS), focal gamma in [1, 4] (focal), MbLS margin m in [2, 20] (MbLS, COG+MbLS), FedLAS
     alpha in [0.01, 0.2] (FedLAS, FedLAS+, COG+FedLAS), the margin-aware weight lambda in
     [0.01, 1] (log; margin, COG+margin).
   - for two-stage methods (TST, V-TST) the second stage's learning rate ``two_stage.lr``,
     log-uniform in [1e-4, 1e-2]: the authors' 1e-4 is the lower end. Their 40 epochs at 1e-4 are
     ~31k Adam steps on CIFAR but 680 on the CPU-scale digits, where the fresh head was still
     falling linearly at epoch 40 (validation NLL 2.30 -> 0.99, baseline's 0.014): without this
     knob TST would be judged unfinished. Their first stage is tuned like the baseline's.

   The ``budget`` settings are the first points of a scrambled Halton sequence
   (``scipy.stats.qmc``, fixed seed): evenly spread for any budget and dimension, and the first
   coordinate, the follower rate, takes the *same* values for every method.
   Values are rounded to two significant digits (readable in configs and tables).
2. **Select** the setting with the lowest validation NLL (mean over tasks) of its best
   checkpoint, the COG paper's criterion (App. B).
3. **Evaluate**: ``seeds`` runs (default 0-4, the paper's five) of the chosen setting; post-hoc calibrators are
   fitted on the baseline runs; ``scripts/compare.py`` writes the report, which pairs each COG
   variant with its counterpart (``method.counterpart``) and says which runs did not converge
   (``mtl_cog.reporting.trajectories.convergence``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import qmc

from mtl_cog.config import Config
from mtl_cog.errors import UserError
from mtl_cog.experiments.sweep import best_index, validation_scores

TUNE_SEED = 1000
SAMPLER_SEED = 0
FOLLOWER_RANGE = (0.5, 4.0)  # x the data set's configured follower rate (a sweep of COG-FC once chose 4x)
LEADER_RATIO = (1 / 30, 1 / 2)  # leader_lr = ratio x follower_lr


@dataclass(frozen=True)
class Knob:
    key: str  # config key the value is written to
    low: float
    high: float
    log: bool  # log-uniform (rates) or uniform (epsilon, gamma)


# A loss with a hyperparameter of its own: one entry here puts it into the tuning.
# Ranges: around the authors' defaults, wide enough to contain the values their papers report.
# LiST's loss (margin_ce) has none: its margin is the robustness target the user asks for, not a
# calibration knob (validation NLL would always pick the smallest), and L is fitted on validation.
LOSS_KNOBS = {
    "ls": Knob("method.label_smoothing", 0.02, 0.2, log=False),
    "focal": Knob("method.focal_gamma", 1.0, 4.0, log=False),
    "mbls": Knob("method.mbls_margin", 2.0, 20.0, log=False),  # MbLS: m = 10 default, tuned on validation
    "fedlas": Knob("method.fedlas_alpha", 0.01, 0.2, log=False),  # FedLAS: 0.05 (CIFAR-10), 0.1 (CIFAR-100)
    "fedlas_mbls": Knob("method.fedlas_alpha", 0.01, 0.2, log=False),  # FedLAS+: 0.1
    "margin": Knob("method.margin_lambda", 0.01, 1.0, log=True),  # ours: 0.1 default
}


STAGE_TWO_KNOB = Knob("two_stage.lr", 1e-4, 1e-2, log=True)  # TST / V-TST's own knob (module docstring)


def search_space(cfg: Config, base_follower_lr: float) -> list[Knob]:
    """The knobs tuned for the method of ``cfg`` (see the module docstring)."""
    knobs = [Knob("optim.follower_lr", base_follower_lr * FOLLOWER_RANGE[0], base_follower_lr * FOLLOWER_RANGE[1],
                  log=True)]
    if cfg.method.leader:
        knobs.append(Knob("leader_ratio", *LEADER_RATIO, log=True))
    if cfg.method.loss in LOSS_KNOBS:
        knobs.append(LOSS_KNOBS[cfg.method.loss])
    if cfg.two_stage.enabled:
        knobs.append(STAGE_TWO_KNOB)
    return knobs


def round_significant(value: float, digits: int = 2) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits - 1}e}")


def trial_settings(knobs: list[Knob], budget: int, seed: int = SAMPLER_SEED) -> list[dict[str, float]]:
    """``budget`` settings: scrambled Halton points mapped onto the knobs' ranges, leader ratio resolved."""
    if budget < 1:
        raise UserError(f"--budget must be >= 1. Got {budget}.")
    points = qmc.Halton(len(knobs), scramble=True, seed=seed).random(budget)
    settings = []
    for point in points:
        values = {}
        for knob, u in zip(knobs, point):
            if knob.log:
                value = math.exp(math.log(knob.low) + u * (math.log(knob.high) - math.log(knob.low)))
            else:
                value = knob.low + u * (knob.high - knob.low)
            values[knob.key] = round_significant(value)
        if "leader_ratio" in values:
            values["optim.leader_lr"] = round_significant(values.pop("leader_ratio") * values["optim.follower_lr"])
        settings.append(values)
    return settings


def as_overrides(setting: dict[str, float]) -> list[str]:
    return [f"{key}={value:g}" for key, value in setting.items()]


@dataclass
class Choice:
    index: int | None  # the chosen trial; None when no trial finished
    nlls: list[float]  # validation NLL of every trial (NaN: not finished)


def edge_knobs(settings: list[dict[str, float]], chosen: int) -> list[str]:
    """The knobs whose chosen value is the lowest or highest one tried, e.g. ``["optim.follower_lr=highest"]``.

    The optimum may then lie outside the range: a comparison should say so rather than present
    the choice as tuned (the range is in ``search_space``; widen it there).
    """
    edges = []
    for key, value in settings[chosen].items():
        tried = {s[key] for s in settings if key in s}
        if len(tried) > 1 and value in (min(tried), max(tried)):
            edges.append(f"{key}={'lowest' if value == min(tried) else 'highest'}")
    return edges


def choose(trial_dirs: list[Path], bins: list[int]) -> Choice:
    """The trial with the lowest validation NLL (first on ties) among finished runs."""
    nlls = [validation_scores(d, bins)["nll"] for d in trial_dirs]
    return Choice(best_index(nlls), nlls)
