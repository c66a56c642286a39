"""The convergence rule cannot be passed by a decayed learning rate alone (``mtl_cog/bundles/trajectories.py``):
the NLL rule is applied again to the live epochs, those whose rate is at least 1/10 of the highest before them."""

import json
from pathlib import Path

import pytest
from test_protocol import write_metrics  # the metrics.jsonl writer of the protocol tests

from mtl_cog.bundles.trajectories import convergence


def with_rates(run: Path, rates: list[float]) -> Path:
    """``run``'s metrics.jsonl with each epoch's follower rate recorded, as training writes it."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for line, rate in zip(lines, rates):
        line["lr"] = {"follower": rate}
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return run


def test_a_decayed_rate_does_not_pass_the_convergence_rule_by_itself(tmp_path):
    # the full-scale schedule's failure mode: still falling while the rate was live, then flat at 1/100
    nlls = [1.0, 0.8, 0.7, 0.62, 0.56, 0.51, 0.47, 0.44, 0.43, 0.43, 0.43, 0.43]
    rates = [1e-3] * 6 + [1e-5] * 6  # two decays at once after epoch 6: epochs 7-12 are dead
    flat_tail = write_metrics(tmp_path / "a", nlls, None)
    assert convergence(flat_tail).converged  # the old rule: the last 20 % is flat
    result = convergence(with_rates(flat_tail, rates))
    assert not result.converged and result.live_epochs == 6
    assert result.nll_gain_live == pytest.approx((0.56 - 0.51) / 0.56)
    assert "of the 6 epochs at >= 0.1 of the first epoch's rate" in result.why_not()
    # the paper's schedule scaled to 30 epochs (÷10 every epoch): one live epoch is no evidence of settling
    stepped = with_rates(write_metrics(tmp_path / "b", [1.0] + [0.5] * 9, None), [1e-3 * 0.1 ** e for e in range(10)])
    result = convergence(stepped)
    assert result.live_epochs == 2 and result.nll_gain_live == pytest.approx(0.5)  # 1e-3 and 1e-4 are live
    assert not result.converged
    paper = with_rates(write_metrics(tmp_path / "c", [1.0] + [0.5] * 9, None), [1e-3 * 0.01 ** e for e in range(10)])
    assert convergence(paper).live_epochs == 1 and "only 1 epoch ran" in convergence(paper).why_not()
    # a constant rate that overfits (best NLL early, rising after) settles; one still improving does not
    overfit = with_rates(write_metrics(tmp_path / "d", [1.0, 0.6, 0.5, 0.48, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9], None),
                         [1e-3] * 10)
    assert convergence(overfit).converged and convergence(overfit).live_epochs == 10
    slow = with_rates(write_metrics(tmp_path / "e", [1.0 - 0.05 * e for e in range(10)], None), [1e-4] * 10)
    assert not convergence(slow).converged
    # at a constant rate the live window is the whole run: its reason is given once, not twice in other words
    assert convergence(slow).why_not().count("validation NLL still fell") == 1
    # a rate that rose (a warm-up, a resume at a higher rate) sets the scale: the decayed tail is not live
    rising = with_rates(write_metrics(tmp_path / "f", nlls, None), [1e-5, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3] + [1e-5] * 6)
    assert convergence(rising).live_epochs == 6 and not convergence(rising).converged
