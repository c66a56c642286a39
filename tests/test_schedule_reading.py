"""A claim read where the COG variant's schedule annealed before it learnt says so (bundle_answers.SCHEDULE_BLIND):
the paper protocol's first campaign divided its COG rates by 10 every epoch (2 of 30 epochs live)."""

from pathlib import Path

import numpy as np

from mtl_cog.analysis.bundle_answers import SCHEDULE_BLIND, annealed_early, claims
from mtl_cog.bundles.bundle import read_bundle
from mtl_cog.bundles.trajectories import live_epoch_count

RESULTS = Path(__file__).parents[1] / "results"


def test_live_epochs_count_the_epochs_before_the_rate_fell_below_a_tenth():
    assert live_epoch_count(np.array([1e-3] * 30)) == 30
    assert live_epoch_count(np.array([1e-3 * 0.1 ** e for e in range(30)])) == 2  # ÷10 every epoch: 1 and 1/10
    assert live_epoch_count(np.array([1e-3] * 20 + [1e-4] * 5 + [1e-5] * 5)) == 25  # steps after 20 and 25
    assert live_epoch_count(np.array([1e-4, 1e-3, 1e-3, 5e-5])) == 3  # a warm-up sets the scale


def test_the_paper_protocols_first_campaign_does_not_test_cog_and_the_fair_one_does():
    paper = read_bundle(RESULTS / "overconfident_paper_fashion_mnist" / "bundle")
    fair = read_bundle(RESULTS / "overconfident_fair_fashion_mnist" / "bundle")
    assert annealed_early(paper) == {("fashion_mnist", d): {"cog_fc", "cog_ls", "cog_ts"} for d in ("1", "2")}
    assert annealed_early(fair) == {}
    table = claims(paper)
    cog = table[table["pair"].str.startswith("cog")]
    assert (cog["answer"] == SCHEDULE_BLIND).all()
    assert cog["draw 1"].str.startswith(SCHEDULE_BLIND + " (").all()  # the draw's own reading kept beside it
    ms = table[table["pair"] == "baseline+ms − baseline"]
    assert not (ms["answer"] == SCHEDULE_BLIND).any()  # a post-hoc claim has no schedule to blame
    assert not (claims(fair)["answer"] == SCHEDULE_BLIND).any()


def test_the_power_simulation_agrees_with_the_noncentral_t():
    """protocol_power's simulated probability that the rule reads supported, against the exact value (the
    noncentral t of each draw's interval; the claims audit computes it that way)."""
    from scipy import stats

    from mtl_cog.analysis.protocol_answers import supported_probability

    for effect, spreads in [(0.01, [(0.01, 5), (0.01, 5)]), (0.03, [(0.02, 5), (0.05, 5)]), (0.005, [(0.01, 3)])]:
        exact = 1.0
        for sd, n in spreads:
            critical = stats.t.ppf(0.975, n - 1)
            exact *= stats.nct.sf(critical, n - 1, effect / (sd / np.sqrt(n)))
        for sign in (-1, 1):  # the claimed side: lower (a gain) or higher (H3's "worse")
            assert abs(supported_probability(effect, spreads, sign) - exact) < 0.01
    assert np.isnan(supported_probability(0.0, [(0.01, 5)], -1))  # no gain: nothing to detect
    assert np.isnan(supported_probability(0.01, [(0.01, 1)], -1))  # one seed: no interval
