"""The hypotheses the claims machinery reads, as data: ``configs/hypotheses/cog_paper.yaml``.

A claim is a paired comparison of final runs (variant − counterpart) with the side the paper says wins; the file
also names the readings a study adds (which claims get a power figure, which the tuning asymmetry and the pinned
controls read, and which settings a pinned variant shares with its counterpart). No module of ``mtl_cog/`` names a
campaign's hypotheses: a new study adds its claims or readings to such a file, not code. Read once, checked: a
damaged file is one ``error:`` line naming it and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from mtl_cog.analysis.paired import COUNTERPART, VARIANT
from mtl_cog.errors import UserError

HYPOTHESES_FILE = Path(__file__).resolve().parents[2] / "configs" / "hypotheses" / "cog_paper.yaml"
READINGS = ("power", "asymmetry", "controls")


@dataclass(frozen=True)
class Claim:
    id: str  # H1 ...
    claim: str  # the wording every table prints
    variant: str
    counterpart: str
    winner: str  # VARIANT or COUNTERPART: the side the paper says wins

    @property
    def as_tuple(self) -> tuple[str, str, str, str]:
        """(claim, variant, counterpart, winner): the row shape the answer tables iterate over."""
        return self.claim, self.variant, self.counterpart, self.winner


@dataclass(frozen=True)
class Hypotheses:
    claims: tuple[Claim, ...]
    metrics: tuple[str, ...]
    power: tuple[str, ...]  # claim ids
    asymmetry: tuple[str, ...]
    controls: dict[str, tuple[str, ...]]  # claim id -> the settings pinned

    def by_id(self, ids) -> tuple[tuple[str, str, str, str], ...]:
        """The claims of ``ids``, in the file's order, as ``Claim.as_tuple``."""
        return tuple(c.as_tuple for c in self.claims if c.id in set(ids))


def _fail(path: Path, key: str, what: str) -> UserError:
    return UserError(f"{path}: {key}: {what}. Restore the file from git (git checkout -- {path.name}).")


def parse_hypotheses(data: object, path: Path) -> Hypotheses:
    """A checked ``Hypotheses`` from the file's YAML (see the file for its keys)."""
    if not isinstance(data, dict):
        raise _fail(path, "(top level)", "not a mapping of metrics, claims and readings")
    rows = data.get("claims")
    if not isinstance(rows, list) or not rows:
        raise _fail(path, "claims", "not a non-empty list")
    claims = []
    for i, row in enumerate(rows):
        fields = ("id", "claim", "variant", "counterpart", "winner")
        if not isinstance(row, dict) or any(not isinstance(row.get(k), str) or not row[k] for k in fields):
            raise _fail(path, f"claims[{i}]", f"needs text values for {', '.join(fields)}")
        if row["winner"] not in (VARIANT, COUNTERPART):
            raise _fail(path, f"claims[{i}].winner", f"{row['winner']!r} is neither {VARIANT} nor {COUNTERPART}")
        claims.append(Claim(*(row[k] for k in fields)))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids) or len({c.variant for c in claims}) != len(claims):
        raise _fail(path, "claims", "an id or a variant appears twice (one counterpart per variant)")
    metrics = data.get("metrics")
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        raise _fail(path, "metrics", "not a non-empty list of metric names")
    readings = data.get("readings", {})
    if not isinstance(readings, dict) or set(readings) - set(READINGS):
        raise _fail(path, "readings", f"a mapping of {', '.join(READINGS)} only")
    named = {}
    for key in ("power", "asymmetry"):
        value = readings.get(key, [])
        if not isinstance(value, list) or set(value) - set(ids):
            raise _fail(path, f"readings.{key}", f"not a list of claim ids ({', '.join(ids)})")
        named[key] = tuple(value)
    controls = readings.get("controls", {})
    if not isinstance(controls, dict) or set(controls) - set(ids) or not all(
            isinstance(v, list) and v and all(isinstance(k, str) for k in v) for v in controls.values()):
        raise _fail(path, "readings.controls", "not a mapping of claim id -> the list of settings pinned")
    return Hypotheses(tuple(claims), tuple(metrics), named["power"], named["asymmetry"],
                      {k: tuple(v) for k, v in controls.items()})


@cache
def load_hypotheses(path: Path = HYPOTHESES_FILE) -> Hypotheses:
    """The hypotheses of ``path`` (the COG paper's by default), read and checked once."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot be read ({err}). Restore it from git.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _fail(path, "(syntax)", str(err).splitlines()[0]) from None
    return parse_hypotheses(data, path)
