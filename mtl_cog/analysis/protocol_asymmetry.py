"""The paper's tuning asymmetry without its step schedule: tuned COG against its untuned baseline, at a constant rate.

The paper protocol (``reproduce --protocol paper``) differs from the fair one in two ways at once: its baseline and
label smoothing are not tuned (Adam 1e-4, smoothing 0.1), and its COG variants divide their rates by 10 every
1/30 of the epochs (3/100 on a multi-task data set; ``experiments/protocol.py``). Scaled by epochs to a 30-epoch
run, that period is one epoch: COG trains for about two epochs and then stands still, so the paper protocol's
answer there is mostly about its schedule. Scaled by *optimiser steps* instead, the paper's period is 1,570 to
2,290 steps (batch 256: 10 epochs of CIFAR-10's 40,000 training pictures left by its 20 % validation split, up to
SVHN's 58,600; 3 epochs of CelebA's 162,770), more than a whole 30-epoch run of the overconfident regime makes (the
mosaic: 20 steps per epoch of 128, 600 in all; Fashion-MNIST 1,200): no step falls inside the run, the rate is
constant.

Read that way, the paper's COG-FC and COG-TS studies *are* the fair protocol's: the same command but for
``--protocol`` (knobs and ranges, tuning seeds and start points, validation NLL), a constant rate. So the tuning
asymmetry is measured without a new run: the fair bundle's COG-FC and COG-TS final runs paired, seed by seed, with
the paper bundle's untuned baseline (and post-hoc TS fitted on it). ``protocol_asymmetry`` gives, per data set,
claim (H1, H3) and metric, that answer (``bundle_answers.claims``'s reading of both draws), its paired difference
(mean over draws) and widest half-width, the fair protocol's answer and difference beside it (against the *tuned*
baseline) and the ``surviving share`` (fair over asymmetric, for H1 where this reading supports it and the fair
answer is complete): how much of the gain the asymmetry shows is left once the baseline is tuned too.

What it measures is the asymmetry in the campaign's regime: the gain over a baseline left at 1e-4 grows with how
far 1e-4 is from the regime's best rate. It says nothing of the asymmetry's size in the paper, whose baseline had
~47,000 steps at 1e-4 (300 epochs of CIFAR-10) where a run here has 600-1,200.

Not read: H2 (COG+LS against LS) needs COG+LS with the paper's fixed 0.1 smoothing at a constant rate, which neither
bundle holds (the fair one tunes its smoothing); H4 (post-hoc MS) concerns the baseline alone (the paper
protocol's own row). The pairing is refused where the two bundles show it is not the same study: commands that
differ beyond the protocol, output folder, plan and parallelism; different training, validation or test sizes of
the finished final runs; different planned final seeds or tuning seeds per draw; a shared COG study whose first
start points or ranges differ.
"""

from __future__ import annotations

import ast

import numpy as np
import pandas as pd

from mtl_cog.analysis.bundle_answers import SUPPORTED, claims, one_draw_of, planned_finals
from mtl_cog.analysis.hypotheses import load_hypotheses
from mtl_cog.analysis.protocol_answers import FAIR, PAPER, Bundles, claim_differences, claimed_gains, over_draws
from mtl_cog.bundles.bundle import FORMAT, Bundle
from mtl_cog.errors import UserError

UNTUNED = "baseline"  # the paper protocol's side: its untuned baseline and the post-hoc calibrators fitted on it
SIZES = ["train_size", "val_size", "test_size"]


def asymmetry_claims() -> tuple[tuple[str, str, str, str], ...]:
    """The claims this reading reads (the hypotheses file's ``readings.asymmetry``: H1, H3)."""
    hypotheses = load_hypotheses()
    return hypotheses.by_id(hypotheses.asymmetry)


def shared_studies() -> tuple[str, ...]:
    """The COG variants whose studies the two protocols share but for the step schedule: those claims' variants."""
    return tuple(variant for _, variant, _, _ in asymmetry_claims())


FIRST_STARTS = (0, 1)  # trials every study starts from a space-filling point (``tuning.start_count``: at least 2)
START_COLUMNS = ["optim.follower_lr", "leader_ratio", "ranges"]
# reproduce's arguments that do not shape the runs: which protocol, where, which plan, how many at once
NOT_DESIGN = {"--protocol", "--out", "--plan", "--jobs", "--tune-workers"}


def _data_sets(bundle: Bundle) -> set[str]:
    return set(bundle.runs["data"].astype(str))


def runs_of(bundle: Bundle, data: str, role: str, methods: tuple[str, ...]) -> pd.DataFrame:
    runs = bundle.done()
    return runs[(runs["data"] == data) & (runs["role"] == role) & runs["method"].isin(methods)]


def _design(command) -> list[str] | None:
    """The ``reproduce`` arguments that shape the runs (``NOT_DESIGN`` and their values left out); None when the
    bundle does not record a readable command."""
    try:
        args = ast.literal_eval(command) if isinstance(command, str) else list(command)
    except (ValueError, SyntaxError, TypeError):
        return None
    kept, skip = [], False
    for arg in args[1:]:
        if skip or arg in NOT_DESIGN:
            skip = not skip and arg in NOT_DESIGN
            continue
        kept.append(str(arg))
    return kept


def _check_same_study(paper: Bundle, fair: Bundle, data: str) -> None:
    """Refuse the pairing where the bundles show different designs, regimes, seeds or COG studies (see above)."""
    where = f"the asymmetry reading of {data} ({paper.name} against {fair.name})"
    studies = shared_studies()
    designs = [_design(b.campaign.get("command")) for b in (paper, fair)]
    if None not in designs and designs[0] != designs[1]:
        raise UserError(f"{where}: the two campaigns' commands differ beyond the protocol ({' '.join(designs[0])} "
                        f"against {' '.join(designs[1])}); they are not the same study.")
    sizes = pd.concat([runs_of(paper, data, "final", (UNTUNED,)), runs_of(fair, data, "final", studies)])
    sizes = sizes[SIZES].drop_duplicates()
    if len(sizes) > 1:
        raise UserError(f"{where}: the paper's baseline and the fair COG runs have different split sizes "
                        f"({sizes.to_dict('records')}); they are not the same regime.")
    planned = [p[p["data"] == data] for p in (planned_finals(paper), planned_finals(fair))]
    for draw in sorted(set(planned[0]["draw"]) | set(planned[1]["draw"])):
        seeds = [set(p.loc[(p["method"] == m) & (p["draw"] == draw), "seed"])
                 for p, m in ((planned[0], UNTUNED), *((planned[1], m) for m in studies))]
        some = [s for s in seeds if s]
        if any(s != some[0] for s in some):
            raise UserError(f"{where}: draw {draw} plans different final seeds on the two sides "
                            f"({[sorted(s) for s in seeds]}); the runs cannot be paired by seed.")
    trial_seeds = [runs_of(b, data, "trial", studies).groupby(["method", "draw"])["seed"].agg(set)
                   for b in (paper, fair)]
    for key in trial_seeds[0].index.intersection(trial_seeds[1].index):
        if trial_seeds[0][key] != trial_seeds[1][key]:
            raise UserError(f"{where}: the {key[0]} study of draw {key[1]} was tuned with different seeds "
                            f"({sorted(trial_seeds[0][key])} against {sorted(trial_seeds[1][key])}).")
    if paper.trials.empty or fair.trials.empty:
        return
    for study in sorted(set(paper.trials["study"]) & set(fair.trials["study"])):
        if not any(study == f"{data}-{m}" or study.startswith(f"{data}-{m}-d") for m in studies):
            continue
        starts = []
        for b in (paper, fair):
            rows = b.trials[(b.trials["study"] == study) & b.trials["trial"].isin(FIRST_STARTS)]
            if "retry_of" in rows:
                rows = rows[rows["retry_of"].isna()]
            starts.append(rows.set_index("trial").reindex(columns=START_COLUMNS))
        shared = starts[0].index.intersection(starts[1].index)
        if not starts[0].loc[shared].equals(starts[1].loc[shared]):
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
    return combined_bundle([(paper, (UNTUNED,)), (fair, shared_studies())], data,
                           {variant: counterpart for _, variant, counterpart, _ in asymmetry_claims()},
                           f"{paper.name} + {fair.name}")


def combined_bundle(parts: list[tuple[Bundle, tuple[str, ...]]], data: str, counterparts: dict[str, str],
                    name: str) -> Bundle:
    """One bundle of ``data``'s final runs of each part's methods (with their post-hoc splits), which the answer
    tables read as one campaign; a run in two parts is refused."""
    sides = [(bundle, runs_of(bundle, data, "final", methods)) for bundle, methods in parts]
    seen: set[str] = set()
    for _, runs in sides:
        twice = seen & set(runs["run"])
        if twice:
            raise UserError(f"{name}: run {sorted(twice)[0]} of {data} is in two of its bundles.")
        seen |= set(runs["run"])
    # every *planned* final run of the chosen methods (finished or not), so that a missing draw reads incomplete
    specs = {run: spec for (b, runs), (_, methods) in zip(sides, parts)
             for run, spec in b.campaign.get("specs", {}).items()
             if run in set(runs["run"]) or _planned_final(spec, data, methods)}
    campaign = {"format": FORMAT, "campaign": name, "specs": specs, "counterparts": counterparts}
    alone = next(filter(None, (one_draw_of(b.campaign) for b, _ in parts)), None)
    if alone:  # a part that ran one draw of several: the combination answers no more than it does
        campaign["one_draw_of"] = alone

    def rows(attribute: str) -> pd.DataFrame:
        frames = [getattr(b, attribute)[getattr(b, attribute)["run"].isin(set(runs["run"]))] for b, runs in sides]
        return pd.concat(frames, ignore_index=True)

    return Bundle(campaign, runs=pd.concat([runs for _, runs in sides], ignore_index=True), results=rows("results"),
                  curves=rows("curves"), reliability=rows("reliability"))


def by_data(given) -> dict[str, Bundle]:
    found: dict[str, Bundle] = {}
    for bundle in [given] if isinstance(given, Bundle) else given:
        for data in _data_sets(bundle):
            found[data] = bundle
    return found


def pair_difference(summed: pd.DataFrame, data: str, variant: str, metric: str) -> tuple[float, float]:
    """(mean over draws, widest half-width) of a claim pair's difference (``over_draws``); NaN where not measured."""
    key = (data, variant, metric)
    return tuple(float(v) for v in summed.loc[key, ["difference", "half_width"]]) if key in summed.index \
        else (np.nan, np.nan)


def rows_against_fair(mixed: Bundle, fair: Bundle, data: str, claims_read) -> list[dict]:
    """Per claim of ``claims_read`` (rows as ``bundle_answers.paper_claims``) and metric that ``mixed`` (one
    campaign's variant against another's counterpart, ``combined_bundle``) answers: its answer, difference (mean
    over draws) and widest half-width, with the fair bundle's own answer and difference beside it."""
    answers = claims(mixed)
    if answers.empty:
        return []
    fair_answers = claims(fair).set_index(["claim", "metric"])["answer"]
    mixed_diffs, fair_diffs = (over_draws(d) if not d.empty else d
                               for d in (claim_differences(mixed), claim_differences(fair)))
    rows = []
    for claim, variant, _, _ in claims_read:
        for answer in answers[answers["claim"] == claim].itertuples():
            difference, half_width = pair_difference(mixed_diffs, data, variant, answer.metric)
            rows.append({"data": data, "claim": claim, "metric": answer.metric, "answer": answer.answer,
                         "difference": difference, "± (95 %)": half_width,
                         "fair": fair_answers.get((claim, answer.metric), ""),
                         "fair difference": pair_difference(fair_diffs, data, variant, answer.metric)[0]})
    return rows


def protocol_asymmetry(bundles: Bundles) -> pd.DataFrame:
    """Per data set (in both protocols' bundles), claim H1/H3 and metric: tuned COG against the paper's untuned
    baseline (answer, difference, widest half-width), the fair protocol's answer and difference, and the surviving
    share: the fair difference over this one, for a claimed gain (H1) this reading supports, once the fair answer is
    complete (a share of a partial fair reading would mix draws); a ratio of two noisy means, without an interval."""
    if PAPER not in bundles or FAIR not in bundles:
        raise UserError(f"the asymmetry table pairs two protocols: name both {PAPER}= and {FAIR}= bundles.")
    papers, fairs = by_data(bundles[PAPER]), by_data(bundles[FAIR])
    rows = []
    for data in sorted(set(papers) & set(fairs)):
        mixed = mixed_bundle(papers[data], fairs[data], data)
        for row in rows_against_fair(mixed, fairs[data], data, asymmetry_claims()):
            shared = (row["claim"] in claimed_gains() and row["answer"] == SUPPORTED and row["difference"] != 0
                      and not row["fair"].startswith("incomplete") and np.isfinite(row["fair difference"]))
            rows.append(row | {"surviving share": row["fair difference"] / row["difference"] if shared else np.nan})
    return pd.DataFrame(rows)
