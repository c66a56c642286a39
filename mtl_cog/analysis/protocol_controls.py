"""Does the hierarchy help? COG variants whose every other setting is their counterpart's, against that counterpart.

A tuned-against-tuned comparison (the fair protocol's claims) mixes the leader with whatever else the two studies
chose: on Fashion-MNIST COG+LS chose smoothing 0.020 / 0.036 against LS's 0.065 / 0.067. The pinned campaign
(``reproduce --pin-to``, ``mtl_cog/experiments/pinning.py``) tunes COG+LS with LS's chosen follower rate and
smoothing, and COG-FC with the baseline's chosen follower rate, per draw of the fair campaign, only the leader rate
left to tune. ``protocol_controls`` pairs those final runs seed by seed with the fair bundle's LS and baseline final
runs (the same draws' seeds) and reads each pair by the plan's rule (``bundle_answers.claims``): per data set,
claim (H1, H2) and metric, the answer, the paired difference (mean over draws) and the widest half-width, with the
fair protocol's tuned-against-tuned answer and difference beside it.

Refused where the bundles show the pair is not "only the leader differs": split sizes or planned seeds that differ,
or a pinned run whose follower rate (or smoothing) is not the one its counterpart's final runs of that draw used.
"""

from __future__ import annotations

import pandas as pd

from mtl_cog.analysis.bundle_answers import planned_finals
from mtl_cog.analysis.hypotheses import load_hypotheses
from mtl_cog.analysis.protocol_answers import FAIR, Bundles
from mtl_cog.analysis.protocol_asymmetry import SIZES, by_data, combined_bundle, rows_against_fair, runs_of
from mtl_cog.bundles.bundle import Bundle
from mtl_cog.errors import UserError

PINNED = "pinned"


def controls() -> dict[str, tuple[tuple[str, str, str, str], tuple[str, ...]]]:
    """variant -> (its claim, the settings it shares with its counterpart's chosen run), from the hypotheses file's
    ``readings.controls`` (COG+LS: LS's follower rate and smoothing; COG-FC: the baseline's follower rate)."""
    hypotheses = load_hypotheses()
    return {c.variant: (c.as_tuple, hypotheses.controls[c.id]) for c in hypotheses.claims
            if c.id in hypotheses.controls}


def _settings(bundle: Bundle, data: str, method: str, keys: tuple[str, ...]) -> dict[str, set[tuple[str, str]]]:
    """draw -> the pinned ``keys``' values the (data, method) final runs were given (their specs' overrides)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for spec in bundle.campaign.get("specs", {}).values():
        labels = spec.get("labels", {}) if isinstance(spec, dict) else {}
        if labels.get("role") != "final" or labels.get("data") != data or labels.get("method") != method:
            continue
        values = dict(o.split("=", 1) for o in spec.get("overrides", []) if o.split("=", 1)[0] in keys)
        out.setdefault(str(labels.get("draw", "")), set()).add(tuple(sorted(values.items())))
    return out


def check_pinned(pinned: Bundle, fair: Bundle, data: str) -> None:
    """Refuse a pinning that is not "only the leader differs" (see above)."""
    where = f"the controls of {data} ({pinned.name} against {fair.name})"
    pairs = controls()
    counterparts = {variant: claim[2] for variant, (claim, _) in pairs.items()}
    sizes = pd.concat([runs_of(pinned, data, "final", tuple(counterparts)),
                       runs_of(fair, data, "final", tuple(counterparts.values()))])
    if len(sizes[SIZES].drop_duplicates()) > 1:
        raise UserError(f"{where}: the runs have different split sizes; they are not the same regime.")
    planned = [p[p["data"] == data] for p in (planned_finals(pinned), planned_finals(fair))]
    for variant, ((_, _, counterpart, _), keys) in pairs.items():
        for draw in sorted(set(planned[0].loc[planned[0]["method"] == variant, "draw"])):
            seeds = [set(p.loc[(p["method"] == m) & (p["draw"] == draw), "seed"])
                     for p, m in ((planned[0], variant), (planned[1], counterpart))]
            if seeds[1] and seeds[0] != seeds[1]:
                raise UserError(f"{where}: draw {draw} of {variant} plans seeds {sorted(seeds[0])}, its counterpart "
                                f"{counterpart} {sorted(seeds[1])}; the runs cannot be paired by seed.")
        mine, theirs = _settings(pinned, data, variant, keys), _settings(fair, data, counterpart, keys)
        for draw, values in mine.items():
            if not theirs.get(draw):
                continue  # the counterpart's draw not planned there: claims() reads it incomplete
            own, chosen = (dict(next(iter(v))) for v in (values, theirs[draw]))
            if len(values) != 1 or len(theirs[draw]) != 1 or any(own.get(k) != v for k, v in chosen.items()):
                raise UserError(f"{where}: {variant}'s draw {draw} ran with {sorted(values)}, {counterpart}'s with "
                                f"{sorted(theirs[draw])}: not pinned to its counterpart's choice.")


def protocol_controls(bundles: Bundles) -> pd.DataFrame:
    """Per data set (in both the pinned and the fair bundles), claim H1/H2 and metric: the pinned variant against
    its counterpart (answer, difference, widest half-width) and the fair protocol's own answer and difference."""
    if PINNED not in bundles or FAIR not in bundles:
        raise UserError(f"the controls table pairs two campaigns: name both {PINNED}= and {FAIR}= bundles.")
    pinneds, fairs = by_data(bundles[PINNED]), by_data(bundles[FAIR])
    pairs = controls()
    counterparts = {variant: claim[2] for variant, (claim, _) in pairs.items()}
    rows = []
    for data in sorted(set(pinneds) & set(fairs)):
        check_pinned(pinneds[data], fairs[data], data)
        mixed = combined_bundle([(fairs[data], tuple(counterparts.values())), (pinneds[data], tuple(counterparts))],
                                data, counterparts, f"{pinneds[data].name} + {fairs[data].name}")
        planned = set(planned_finals(pinneds[data])["method"])  # the variants it pinned
        rows += rows_against_fair(mixed, fairs[data], data,
                                  [claim for variant, (claim, _) in pairs.items() if variant in planned])
    return pd.DataFrame(rows, columns=["data", "claim", "metric", "answer", "difference", "± (95 %)", "fair",
                                       "fair difference"])
