"""The paper's tuning asymmetry alone: tuned COG against the untuned baseline, both at a constant rate.

The paper protocol (``reproduce --protocol paper``) differs from the fair one in two ways at once: its baseline and
label smoothing are not tuned (Adam 1e-4, smoothing 0.1), and its COG variants divide their rates by 10 every
1/30 of the epochs (3/100 on a multi-task data set; ``experiments/protocol.py``). Scaled by epochs to a 30-epoch
run, that period is one epoch: COG trains for about two epochs and then stands still, so the paper protocol's
answer there is mostly about its schedule. Scaled by *optimiser steps* instead, the paper's period is 1,570 to
2,290 steps (batch 256: 10 epochs of CIFAR-10's 40,000 training pictures left by its 20 % validation split, up to
SVHN's 58,600; 3 epochs of CelebA's 162,770), more than a whole 30-epoch run of the overconfident regime makes (the
mosaic: 20 steps per epoch of 128, 600 in all; Fashion-MNIST 1,200): no step falls inside the run, the rate is
constant.

Read that way, the paper's COG-FC and COG-TS studies *are* the fair protocol's: the same knobs and ranges (the
follower rate and the leader/follower ratio), the same tuning seeds and start points, validation NLL, a constant
rate. So the asymmetry by itself is measured without a new run: the fair bundle's COG-FC and COG-TS final runs
paired, seed by seed, with the paper bundle's untuned baseline (and post-hoc TS fitted on it). ``protocol_asymmetry``
gives, per data set, claim (H1, H3) and metric, that answer (``bundle_answers.claims``'s reading of both draws),
its paired difference (mean over draws) and widest half-width, the fair protocol's difference beside it (against
the *tuned* baseline) and the ``surviving share`` (fair over asymmetric, where the asymmetric reading supports the
claim): how much of the gain the asymmetry shows is left once the baseline is tuned too.

Not read: H2 (COG+LS against LS) needs COG+LS with the paper's fixed 0.1 smoothing at a constant rate, which neither
bundle holds (the fair one tunes its smoothing); H4 (post-hoc MS) concerns the baseline alone (the paper
protocol's own row). The pairing is refused where the two bundles show it is not the same study: different
training, validation or test sizes, different planned seeds per draw, or a shared COG study whose trials start
from different points or ranges.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mtl_cog.errors import UserError
from mtl_cog.reporting.bundle import FORMAT, Bundle
from mtl_cog.reporting.bundle_answers import PAPER_CLAIMS, SUPPORTED, claims, planned_finals
from mtl_cog.reporting.protocol_answers import FAIR, PAPER, Bundles, claim_differences

SHARED_STUDIES = ("cog_fc", "cog_ts")  # the COG variants whose studies the two protocols share but for the step
UNTUNED = "baseline"  # the paper protocol's side: its untuned baseline and the post-hoc calibrators fitted on it
CLAIMS_READ = tuple(c for c in PAPER_CLAIMS if c[1] in SHARED_STUDIES)
SIZES = ["train_size", "val_size", "test_size"]
START_COLUMNS = ["trial", "optim.follower_lr", "leader_ratio", "ranges"]


def _data_sets(bundle: Bundle) -> set[str]:
    return set(bundle.runs["data"].astype(str))


def _finals(bundle: Bundle, methods: tuple[str, ...]) -> pd.DataFrame:
    runs = bundle.runs
    return runs[(runs["role"] == "final") & runs["method"].isin(methods)]


def _check_same_study(paper: Bundle, fair: Bundle, data: str) -> None:
    """Refuse the pairing where the bundles show different regimes, seeds or COG studies (see above)."""
    where = f"the asymmetry reading of {data} ({paper.name} against {fair.name})"
    sizes = pd.concat([_finals(paper, (UNTUNED,)), _finals(fair, SHARED_STUDIES)])[SIZES].drop_duplicates()
    if len(sizes) > 1:
        raise UserError(f"{where}: the paper's baseline and the fair COG runs have different split sizes "
                        f"({sizes.to_dict('records')}); they are not the same regime.")
    planned_paper, planned_fair = planned_finals(paper), planned_finals(fair)
    for draw in sorted(set(planned_paper["draw"]) | set(planned_fair["draw"])):
        seeds = [set(p.loc[(p["method"] == m) & (p["draw"] == draw), "seed"])
                 for p, m in ((planned_paper, UNTUNED), *((planned_fair, m) for m in SHARED_STUDIES))]
        planned = [s for s in seeds if s]
        if any(s != planned[0] for s in planned):
            raise UserError(f"{where}: draw {draw} plans different final seeds on the two sides "
                            f"({[sorted(s) for s in seeds]}); the runs cannot be paired by seed.")
    if paper.trials.empty or fair.trials.empty:
        return
    for study in sorted(set(paper.trials["study"]) & set(fair.trials["study"])):
        if not any(study.startswith(f"{data}-{m}") for m in SHARED_STUDIES):
            continue
        starts = [b.trials[(b.trials["study"] == study) & b.trials["retry_of"].isna()].sort_values("trial")
                  [START_COLUMNS].head(4).reset_index(drop=True) for b in (paper, fair)]
        if len(starts[0]) == len(starts[1]) and not starts[0].equals(starts[1]):
            raise UserError(f"{where}: study {study} starts from different points or ranges in the two bundles; "
                            "the fair study is not the paper's at a constant rate.")


def _planned_final(spec, data: str, methods: tuple[str, ...]) -> bool:
    labels = spec.get("labels") if isinstance(spec, dict) else None
    return isinstance(labels, dict) and labels.get("role") == "final" and labels.get("data") == data \
        and labels.get("method") in methods


def mixed_bundle(paper: Bundle, fair: Bundle, data: str) -> Bundle:
    """The paper bundle's untuned baseline final runs of ``data`` (with their post-hoc splits) and the fair bundle's
    COG-FC and COG-TS final runs, as one bundle the answer tables read; refused where they are not comparable."""
    _check_same_study(paper, fair, data)
    sides = [(paper, _finals(paper, (UNTUNED,))), (fair, _finals(fair, SHARED_STUDIES))]
    sides = [(b, runs[runs["data"] == data]) for b, runs in sides]
    names = [set(runs["run"]) for _, runs in sides]
    if names[0] & names[1]:
        raise UserError(f"the asymmetry reading of {data}: run {sorted(names[0] & names[1])[0]} is in both bundles.")
    # every *planned* final run of the chosen methods (finished or not), so that a missing draw reads incomplete
    specs = {run: spec for (b, runs), methods in zip(sides, ((UNTUNED,), SHARED_STUDIES))
             for run, spec in b.campaign.get("specs", {}).items()
             if run in set(runs["run"]) or _planned_final(spec, data, methods)}
    campaign = {"format": FORMAT, "campaign": f"{paper.name} + {fair.name}", "specs": specs,
                "counterparts": {variant: counterpart for _, variant, counterpart, _ in CLAIMS_READ}}

    def rows(attribute: str) -> pd.DataFrame:
        frames = [getattr(b, attribute)[getattr(b, attribute)["run"].isin(set(runs["run"]))] for b, runs in sides]
        return pd.concat(frames, ignore_index=True)

    return Bundle(campaign, runs=pd.concat([runs for _, runs in sides], ignore_index=True), results=rows("results"),
                  curves=rows("curves"), reliability=rows("reliability"))


def _by_data(given) -> dict[str, Bundle]:
    found: dict[str, Bundle] = {}
    for bundle in [given] if isinstance(given, Bundle) else given:
        for data in _data_sets(bundle):
            found[data] = bundle
    return found


def protocol_asymmetry(bundles: Bundles) -> pd.DataFrame:
    """Per data set (in both protocols' bundles), claim H1/H3 and metric: tuned COG against the paper's untuned
    baseline (answer, difference, widest half-width), the fair difference and the surviving share (see above)."""
    if PAPER not in bundles or FAIR not in bundles:
        raise UserError(f"the asymmetry table pairs two protocols: name both {PAPER}= and {FAIR}= bundles.")
    papers, fairs = _by_data(bundles[PAPER]), _by_data(bundles[FAIR])
    rows = []
    for data in sorted(set(papers) & set(fairs)):
        mixed = mixed_bundle(papers[data], fairs[data], data)
        answers = claims(mixed)
        if answers.empty:
            continue
        mixed_diffs, fair_diffs = (claim_differences(b) for b in (mixed, fairs[data]))
        for claim, variant, _, _ in CLAIMS_READ:
            for answer in answers[answers["claim"] == claim].itertuples():
                row = {"data": data, "claim": claim, "metric": answer.metric, "answer": answer.answer}
                for label, diffs in (("", mixed_diffs), ("fair ", fair_diffs)):
                    found = diffs[(diffs["data"] == data) & (diffs["variant"] == variant)
                                  & (diffs["metric"] == answer.metric)] if not diffs.empty else diffs
                    row[f"{label}difference"] = float(found["mean_difference"].mean()) if len(found) else np.nan
                    if not label:
                        row["± (95 %)"] = float(found["half_width"].max()) if len(found) else np.nan
                gain = row["difference"]
                supported = answer.answer == SUPPORTED and np.isfinite(gain) and gain != 0
                row["surviving share"] = row["fair difference"] / gain if supported else np.nan
                rows.append(row)
    return pd.DataFrame(rows)
