"""Every shipped COG config of ``synthetic`` and ``digits`` does something, as shipped; where it beats the baseline's
test ECE on these two built-in data sets, it keeps doing so.

Trained with the config as it is (only ``tracking=none`` and the output folder added), a COG config's calibrator
must leave the identity (for calibrators with parameters: ``calibrator_at_identity`` false; a head leader has none
to leave): a newcomer's first COG run must never be the baseline in disguise.

Its mean test ECE@15 is compared with the baseline's (``baseline.yaml`` of the same data set, as shipped). Measured
(seed 0, one torch thread, 40 epochs, the best-validation-Brier checkpoint), COG does *not* beat the baseline for
most configs here, and no rate chosen on these runs' test scores would be honest evidence that it does:

- ``digits``: the baseline is already calibrated, test ECE@15 0.0071 at 99.4 % accuracy on 360 test pictures (a
  handful of mistakes; a perfectly calibrated model scores about that on so few). Of the COG configs only COG-VS
  scored lower (0.0051); COG-TS 0.0083, COG-MS 0.0097, COG-FC 0.0112, COG+LS 0.1145 (smoothing makes a 99.7 %
  accurate model underconfident).
- ``synthetic``: the checkpoint rule picks epoch 6 of 40, before the overconfidence that later epochs build up
  (validation ECE@15 0.09 there, 0.14 at epoch 40), so the baseline's 0.0546 leaves little to fix. COG-FC (0.0456),
  COG+MbLS (0.0506) and COG-TST (0.0494) scored lower; COG-TS 0.0584, COG+LS 0.0650, COG+FedLAS 0.0627, COG-margin
  0.0580 did not, nor did COG-VS, COG-MS and COG-LiST (0.0555, 0.0574, 0.0631) once their leader rate was raised
  to 5e-4 (at 1e-4 their calibrators never left the identity). COG's leader learns on the training
  minibatches, where an overfitting network is right more often than on new pictures, so its temperature is pulled
  down (sharper), not up (COG-TS's ended at 0.97 after 5 epochs): it cannot undo overconfidence that only held-out
  data shows. That is the COG paper's own claim that
  COG-TS is worse than post-hoc TS (``docs/results/`` measures it with tuned rates and intervals over seeds).

So the ECE comparison is asserted for the configs measured to beat the baseline (``BEATS_BASELINE``: a regression
check that they keep doing so), and the others are listed with their numbers above instead of being tuned on the
test set until one seed happens to pass. Each run takes minutes on one core, so the whole check is ``slow``; the
README's example (COG-TS on ``synthetic``, 5 epochs) is checked in the fast suite by ``tests/test_readme_tour.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_cog.cli import train

REPO = Path(__file__).resolve().parents[1]
DATA = ("synthetic", "digits")
COG_CONFIGS = [(data, path.stem) for data in DATA for path in sorted((REPO / "configs" / data).glob("cog_*.yaml"))]
BEATS_BASELINE = {("synthetic", "cog_fc"), ("synthetic", "cog_mbls"), ("synthetic", "cog_tst"), ("digits", "cog_vs")}


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
    assert BEATS_BASELINE <= set(COG_CONFIGS)  # a renamed or removed config fails here, not silently


@pytest.mark.slow
@pytest.mark.parametrize(("data", "method"), COG_CONFIGS, ids=[f"{d}-{m}" for d, m in COG_CONFIGS])
def test_a_shipped_cog_config_leaves_the_identity_and_keeps_its_measured_ece(data, method, baselines, tmp_path):
    record = train_shipped(data, method, tmp_path)
    assert record.get("calibrator_at_identity") is not True, f"{data}/{method}: the calibrator never left the identity"
    if (data, method) in BEATS_BASELINE:
        ece, baseline_ece = record["test"]["ece@15"], baselines[data]["test"]["ece@15"]
        assert ece < baseline_ece, f"{data}/{method}: test ECE@15 {ece:.4f}, the baseline's {baseline_ece:.4f}"
