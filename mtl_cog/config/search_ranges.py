"""A tuned knob's searched range, written down and read back, and whether a choice sits at its edge.

The fair protocol (``mtl_cog.experiments.protocol``) searches each knob over a range; ``trials.csv`` of a results
bundle records the ranges (``ranges_text``) so that a report made from the bundle alone can say which chosen
knob lies in the outer ``EDGE_SHARE`` of its range (``range_edges``), where the range, not the method, bounded
the result. This sits in the config layer because both the experiments (which search) and the reports (which
read a bundle) need it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

EDGE_SHARE = 0.05  # a choice in the outer 5 % of a knob's range (in its own scale) is "at the edge"


@dataclass(frozen=True)
class Knob:
    key: str  # config key the value is written to
    low: float
    high: float
    log: bool  # log-uniform (rates) or uniform (epsilon, gamma)
    floor: float = 0.0  # what the value can never go below or above, however far the range is widened
    ceiling: float = math.inf


def ranges_text(knobs: list[Knob]) -> str:
    """The searched ranges as trials.csv and chosen_settings.csv record them (``parse_ranges`` reads them back):
    ``optim.follower_lr=log[0.0003,0.03] method.label_smoothing=linear[0.02,0.2]``."""
    return " ".join(f"{k.key}={'log' if k.log else 'linear'}[{k.low:g},{k.high:g}]" for k in knobs)


RANGE_ITEM = re.compile(r"^(?P<key>[^=\s]+)=(?P<scale>log|linear)\[(?P<low>[^,\]]+),(?P<high>[^\]]+)\]$")


def parse_ranges(text: str) -> list[Knob]:
    """``ranges_text``'s output -> its knobs; raises ValueError on anything else."""
    knobs = []
    for item in str(text).split():
        match = RANGE_ITEM.match(item)
        if match is None:
            raise ValueError(f"not a searched range: {item!r}")
        low, high = float(match["low"]), float(match["high"])
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (match["scale"] == "log" and low <= 0):
            raise ValueError(f"not a searched range: {item!r}")
        knobs.append(Knob(match["key"], low, high, match["scale"] == "log"))
    return knobs


def range_edges(knobs: list[Knob], values: dict[str, float], share: float = EDGE_SHARE) -> list[str]:
    """The knobs whose value lies in the outer ``share`` of their range, e.g. ``["optim.follower_lr=highest"]``.

    The optimum may then lie outside the range: a comparison should say so rather than present
    the choice as tuned (widen the range in ``search_space``). The position is measured in the
    knob's own scale (log for rates). The leader ratio's top, 1, is no hierarchy: a choice there
    is flagged too, since it says the method did best without the leader being slower.
    """
    edges = []
    for knob in knobs:
        if knob.key not in values:
            continue
        scale = math.log if knob.log else (lambda v: v)
        position = (scale(values[knob.key]) - scale(knob.low)) / (scale(knob.high) - scale(knob.low))
        if position <= share:
            edges.append(f"{knob.key}=lowest")
        elif position >= 1 - share:
            edges.append(f"{knob.key}=highest")
    return edges


def knob_values(overrides: str) -> dict[str, float]:
    """``key=value key=value`` (trials.csv's ``overrides``: what a trial ran with, to the digit) -> {key: value} of
    the finite numeric ones (a flag such as ``optim.allow_leader_lr_geq_follower=true``, which a leader ratio near 1
    brings, is no knob)."""
    values = {}
    for key, _, value in (item.partition("=") for item in str(overrides).split() if "=" in item):
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            values[key] = number
    return values
