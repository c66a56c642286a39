"""Every shipped COG config of ``synthetic`` and ``digits`` shows COG working, as shipped.

Trained with the config as it is (only ``tracking=none`` and the output folder added), a COG config's
calibrator must leave the identity (for calibrators with parameters: ``calibrator_at_identity`` false; a head
leader has none to leave) and its mean test ECE@15 must be below the baseline's (``baseline.yaml`` of the same
data set, as shipped). The configs carry the rates that make it so; a config whose rates stop doing it fails
here instead of showing a newcomer that COG does nothing.

Each run takes minutes on one core (40 epochs), so the whole check is ``slow``; the README's example (COG-TS on
``synthetic``, 5 epochs, against the baseline with the same epochs) is checked in the fast suite by
``tests/test_readme_tour.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_cog.cli import train

REPO = Path(__file__).resolve().parents[1]
DATA = ("synthetic", "digits")
COG_CONFIGS = [(data, path.stem) for data in DATA for path in sorted((REPO / "configs" / data).glob("cog_*.yaml"))]


def final_record(run_dir: Path) -> dict:
    """The last line of a run's metrics.jsonl: the best checkpoint's test metrics and the identity flag."""
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def train_shipped(data: str, method: str, out: Path) -> dict:
    return final_record(train.main(["--data", data, "--method", method, "--out", str(out), "tracking=none"]))


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("baselines")
    return {data: train_shipped(data, "baseline", out) for data in DATA}


def test_every_shipped_cog_config_is_checked():
    assert len(COG_CONFIGS) >= 2 * 10 and ("synthetic", "cog_ts") in COG_CONFIGS


@pytest.mark.slow
@pytest.mark.parametrize(("data", "method"), COG_CONFIGS, ids=[f"{d}-{m}" for d, m in COG_CONFIGS])
def test_a_shipped_cog_config_leaves_the_identity_and_beats_the_baseline(data, method, baselines, tmp_path):
    record = train_shipped(data, method, tmp_path)
    assert record.get("calibrator_at_identity") is not True, f"{data}/{method}: the calibrator never left the identity"
    ece, baseline_ece = record["test"]["ece@15"], baselines[data]["test"]["ece@15"]
    assert ece < baseline_ece, f"{data}/{method}: test ECE@15 {ece:.4f}, the baseline's {baseline_ece:.4f}"
