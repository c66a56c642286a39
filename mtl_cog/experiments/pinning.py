"""Controls that isolate the hierarchy: a COG variant tuned with its counterpart's choice pinned (``--pin-to``).

A tuned-against-tuned comparison (COG+LS against LS, each tuned over its own follower rate and smoothing) mixes two
differences: the leader, and whatever else the two studies chose. On Fashion-MNIST COG+LS chose smoothing 0.020 /
0.036 against LS's 0.065 / 0.067, where LS is underconfident: its gain could be the smaller smoothing's. A pinned
study removes that: every knob the variant shares with its counterpart (the follower rate; LS's smoothing) is fixed
at the value the counterpart's study chose *in the same draw* of a finished fair campaign (its last ``--widen``
re-tuning where it had one: what its final runs used), and only what the
counterpart lacks (the leader/follower ratio) is tuned, with the same budget and rule. Its final runs then differ
from the counterpart's only in the leader, and pair seed by seed with the counterpart's finals in that campaign's
bundle (the same draws' seeds).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from mtl_cog.bundles import bundle as bundles
from mtl_cog.config import search_ranges
from mtl_cog.errors import UserError
from mtl_cog.experiments import tuning

Studies = dict[tuple[str, str, str], tuning.StudySpec]


def pinned_studies(studies: Studies, pin_dir: Path, counterparts: dict[str, str], scale: str) -> Studies:
    """``studies`` with each one's shared knobs pinned to its counterpart's choice in ``pin_dir``'s bundle (a
    results folder holding ``bundle/``, or the bundle itself). Refused in one line: no readable bundle, a bundle of
    another protocol or ``--scale``, a method without a counterpart, a counterpart study the bundle lacks or that
    chose nothing."""
    folder = pin_dir if (pin_dir / bundles.CAMPAIGN).is_file() else bundles.bundle_dir(pin_dir)
    recorded = bundles.read_bundle(folder)
    if recorded is None or recorded.trials.empty or "study" not in recorded.trials:
        raise UserError(f"--pin-to {pin_dir}: no results bundle with tuning trials there ({folder}); give the folder "
                        "of a finished fair-protocol campaign (e.g. results/overconfident_fair_fashion_mnist).")
    command = [str(a) for a in recorded.campaign.get("command", [])]
    if "--protocol" not in command or command[command.index("--protocol") + 1:][:1] != ["fair"]:
        raise UserError(f"--pin-to {pin_dir}: its campaign did not run the fair protocol ({' '.join(command[:8])} "
                        "...); pin to a fair campaign, whose counterparts were tuned.")
    recorded_scale = command[command.index("--scale") + 1] if "--scale" in command[:-1] else "cpu"
    if recorded_scale != scale:
        raise UserError(f"--pin-to {pin_dir}: its campaign ran --scale {recorded_scale}, this one --scale {scale}: a "
                        "choice made at another scale pins nothing comparable. Use the same --scale.")
    out = {}
    for key, spec in studies.items():
        counterpart = counterparts.get(spec.method)
        if not counterpart:
            raise UserError(f"--pin-to: {spec.method} has no counterpart to be pinned to (method.counterpart); run "
                            "only COG variants with --pin-to (e.g. --method cog_ls cog_fc).")
        base = f"{spec.dataset}-{counterpart}" + ("" if spec.draw == "1" else f"-d{spec.draw}")
        choice = _chosen(recorded.trials, last_widening(recorded.trials, base), pin_dir)
        pinned = {k.key: choice[k.key] for k in spec.knobs if k.key in choice}
        if "optim.follower_lr" not in pinned:
            raise UserError(f"--pin-to {pin_dir}: the counterpart study of {spec.name} holds no chosen follower rate; "
                            "it cannot pin the variant's.")
        knobs = tuple(k for k in spec.knobs if k.key not in pinned)
        out[key] = dataclasses.replace(spec, knobs=knobs, pinned=tuple(sorted(pinned.items())))
    return out


def last_widening(trials: pd.DataFrame, base: str) -> str:
    """The study whose choice the counterpart's final runs used: ``base``, or its last ``--widen`` re-tuning
    (``base-wN``, the highest N the bundle records)."""
    names = set(trials["study"].dropna().astype(str))
    widenings = [int(n[len(base) + 2:]) for n in names if n.startswith(f"{base}-w") and n[len(base) + 2:].isdigit()]
    return f"{base}-w{max(widenings)}" if widenings else base


def _chosen(trials: pd.DataFrame, study: str, pin_dir: Path) -> dict[str, float]:
    """The chosen trial's settings in ``study`` (trials.csv's ``chosen`` mark), read from its overrides: the values
    the counterpart's final runs were given."""
    rows = trials[(trials["study"] == study) & (trials.get("chosen", pd.Series(dtype=str)).astype(str) == "*")]
    if len(rows) != 1:
        raise UserError(f"--pin-to {pin_dir}: its bundle's study {study} has {len(rows)} chosen trials, not one: the "
                        "counterpart's tuning is not finished there (or the study is missing).")
    return search_ranges.knob_values(rows.iloc[0].get("overrides", ""))  # what its final runs were given
