"""The plan's decision rule as this audit reads it: the claims, the per-draw reading of a paired 95 % t interval
and a claim's answer over the draws. Pure statistics on numbers; nothing here reads a file."""

from typing import NamedTuple

import numpy as np
from scipy import stats

# The page's claim wording -> (id, variant, counterpart, claimed sign of variant − counterpart on NLL and ECE@15).
CLAIMS = {
    "COG-FC improves on the baseline": ("H1", "cog_fc", "baseline", -1),
    "COG+LS improves on label smoothing": ("H2", "cog_ls", "ls", -1),
    "COG-TS is worse than post-hoc TS": ("H3", "cog_ts", "baseline+ts", +1),
    "unregularised post-hoc MS worsens the baseline": ("H4", "baseline+ms", "baseline", +1),
}
CLAIM_OF_ID = {ident: text for text, (ident, *_) in CLAIMS.items()}
GAINS = ("H1", "H2")  # the claimed gains: the only claims a surviving share is a share of
DRAWS = (1, 2)
IDENTITY = 0.01  # a learned temperature within 1 % of 1 leaves the predictions as they were
# a schedule whose follower rate stays >= 1/10 of its first epoch's for less than half a run annealed before COG learnt
LIVE_SHARE, MIN_LIVE_SHARE = 0.1, 0.5
SCHEDULE = "does not test COG (schedule)"
GATE_ECE, GATE_CHANGE, GATE_SEEDS = 0.03, -0.05, 3  # the regime gate's thresholds and fewest seeds
RULES = {"best validation Brier": "", "last epoch": "@last"}  # checkpoint rule -> its results splits' suffix
SECONDARY_BASE = {"last epoch": "test@last", "Guo's TS recipe": "test"}
GAP = "confidence − accuracy"
PRIMARY, ALL_METRICS = ("ece@15", "nll"), ("accuracy", "ece@15", "nll")
SECONDARY_PAIRS = {"last epoch": [f"{variant} − {counterpart}" for _, variant, counterpart, _ in CLAIMS.values()],
                   "Guo's TS recipe": ["cog_ts − baseline+ts_guo"]}


class Draw(NamedTuple):
    n: int  # seeds with both sides finished
    planned: int
    mean: float
    low: float
    high: float
    half: float
    reading: str
    untested: bool  # COG-TS's temperature stayed at identity in this draw
    annealed: bool = False  # the variant's every final run of the draw annealed its rate early (SCHEDULE)


def t_interval(x) -> tuple[float, float, float, float]:
    """Mean and 95 % t interval (low, high, half-width) over seeds; no interval below two seeds."""
    x = np.asarray(x, float)
    mean = float(x.mean()) if len(x) else np.nan
    if len(x) < 2:
        return mean, np.nan, np.nan, np.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half, half



def reading(low: float, high: float, side: int, n: int) -> str:
    """A draw's reading: its interval turned to the claimed side (``side``) lies above 0, below 0, or holds it."""
    if n < 2:
        return "" if n == 0 else "no interval (one seed)"
    low, high = sorted((side * low, side * high))
    return "supported" if low > 0 else "contradicted" if high < 0 else "inconclusive at this scale"



def supported_power(effect: float, draws: list[Draw]) -> float:
    """P(every draw's 95 % t interval excludes 0 on the claimed side) when the true difference is ``effect`` (> 0)
    there: per draw 1 − F(t₀.₉₇₅) of the noncentral t with n − 1 degrees of freedom and noncentrality
    effect / (sd / √n), sd the draw's own spread of paired differences; the draws independent."""
    if not effect > 0 or not draws or any(r.n < 2 or not np.isfinite(r.half) for r in draws):
        return np.nan
    power = 1.0
    for r in draws:
        critical = stats.t.ppf(0.975, r.n - 1)
        sd = r.half * np.sqrt(r.n) / critical
        power *= float(stats.nct.sf(critical, r.n - 1, effect / (sd / np.sqrt(r.n)))) if sd > 0 else 1.0
    return power


def summarise(draws: dict[int, Draw]) -> tuple[float, float]:
    """The mean of the draws' mean differences and the widest draw's half-width (draws that ran)."""
    ran = [r for r in draws.values() if r.n]
    halves = [r.half for r in ran if np.isfinite(r.half)]
    return float(np.mean([r.mean for r in ran])) if ran else np.nan, max(halves) if halves else np.nan


def answer(draws: dict[int, Draw], scored: bool = True, alone: tuple[int, int] | None = None) -> str:
    """A claim's answer over the draws; blank where the table's bundle has no finished final run at all (``scored``
    false: the generator writes no row), else *incomplete* naming each draw short of its planned seeds, then *no
    answer* where the campaign ran one draw of several (``alone``)."""
    if not scored:
        return ""
    gaps = [f"draw {d} missing" if r.n == 0 else f"draw {d}: {r.n} of {r.planned} seeds"
            for d, r in draws.items() if r.n == 0 or r.n < r.planned]
    if gaps:
        return f"incomplete ({', '.join(gaps)})"
    if alone:  # one draw of several ran: the rule needs them all
        return f"no answer (draw {alone[0]} of {alone[1]} alone)"
    if any(r.annealed for r in draws.values()):
        return SCHEDULE
    if any(r.untested for r in draws.values()):
        return "not tested at this budget"
    readings = {r.reading for r in draws.values()}
    return readings.pop() if len(readings) == 1 else "depends on the tuning draw"


def surviving_share(claim_text: str, answer_text: str, difference: float, fair_answer: str,
                    fair_difference: float) -> float:
    """The fair difference over a supported claimed gain's (H1, H2), once the fair answer is complete; else NaN."""
    shared = (CLAIMS[claim_text][0] in GAINS and answer_text == "supported" and difference != 0
              and not fair_answer.startswith("incomplete") and np.isfinite(fair_difference))
    return fair_difference / difference if shared else np.nan
