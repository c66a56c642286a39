"""The paper's claims under two protocols side by side: what survives when every method gets the same tuning.

The COG paper tuned its COG variants' learning rates and ran the baseline at a fixed Adam 1e-4 and label smoothing
at 0.1 (``reproduce --protocol paper``); the fair protocol tunes every method with the same budget
(``--protocol fair``). Run in the same regime with the same seeds, each has its own results bundle, and
``protocol_claims`` sets their ``claims`` answers side by side, per data set, claim and metric:

- ``<protocol>``: the claim's answer under that protocol (``bundle_answers.claims``: supported / contradicted /
  inconclusive when the draws agree, depends on the tuning draw, incomplete, not tested);
- ``<protocol> difference``: the paired difference (variant − counterpart, task mean, mean over seeds) averaged
  over the draws, and ``<protocol> ± (95 %)``: the widest draw's interval half-width, what the protocol could
  have resolved;
- ``surviving share``: where the paper protocol supports a claimed gain (H1, H2: ``claimed_gains``) and the fair
  answer is complete (a partial one would mix draws), the fair protocol's difference over the paper protocol's
  (1: all of the gain survives, 0: none, below 0: reversed). A ratio of two noisy means, shown without an
  interval: read it with the two half-widths beside it.

A protocol may hold several bundles (one per data set: a campaign's lane writes one); a data set appears in one of
them only. ``protocol_power`` gives, per protocol, data set and primary metric, the **power of the decision rule**
for each claim H1-H3: the probability that it reads *supported* (both draws' 95 % intervals excluding 0 on the
claimed side) if the true paired difference were a gain the size of post-hoc TS's on the baseline (the
calibration the regime leaves to fix), simulated (``POWER_SIMULATIONS`` draws of each draw's seeds, normal
differences with the draw's measured spread of paired differences, read with the page's own interval). The gain
is measured on the protocol's own final runs (``baseline − baseline+ts``, task-mean test metric, mean over seeds,
then over draws): the same runs, checkpoint and seeds as the claims (under the paper protocol, its untuned
baseline). A half-width smaller than the gain is no such guarantee: at 5 seeds a draw whose half-width equals the
gain reads supported about half the time, and the rule needs both draws. Blank where a claim lacks a draw with an
interval; ``power note`` says so while a claim of the data set is incomplete or TS's gain rests on part of the
planned runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from mtl_cog.analysis.bundle_answers import (
    SUPPORTED,
    claim_metrics,
    claims,
    draw_gap,
    final_scores,
    interval_reading,
    paper_claims,
    planned_draws,
    planned_finals,
    reversed_predictions,
)
from mtl_cog.analysis.hypotheses import load_hypotheses
from mtl_cog.analysis.paired import CONFIDENCE, VARIANT, paired_differences, seed_t_interval
from mtl_cog.bundles.bundle import Bundle, wide_scores
from mtl_cog.errors import UserError

PAPER, FAIR = "paper", "fair"
POWER_METRICS = ("nll", "ece@15")  # the primary metrics of the plan
TS_PAIR = {"baseline+ts": "baseline"}  # the gain a calibration method could at most be expected to show
LAST = "test@last"  # the last epoch's test split (``eval.score_last_epoch``)


def claimed_gains() -> frozenset[str]:
    """The claims of a gain (the variant better: H1, H2), the only ones a surviving share is a share of."""
    return frozenset(claim for claim, _, _, expected in paper_claims() if expected == VARIANT)


def claim_differences(bundle: Bundle, pairs: dict[str, str] | None = None,
                      scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per data set, draw, pair (the claims' by default) and metric: the paired mean difference, its interval's
    half-width and which side it favours (``better``); of the final runs' test scores, or of ``scores``."""
    scores = final_scores(bundle) if scores is None else scores
    if scores.empty:
        return pd.DataFrame()
    pairs = pairs or claim_pairs()
    frames = []
    for (data, draw), group in scores.groupby(["data", "draw"], sort=True):
        table = paired_differences(group.rename(columns={"data": "dataset"}), pairs, claim_metrics())
        frames.append(table.assign(data=data, draw=draw))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if table.empty:
        return table
    table["half_width"] = (table["ci_high"] - table["ci_low"]) / 2
    table["better"] = [interval_reading(row) for row in table.itertuples()]
    return table[["data", "draw", "variant", "counterpart", "metric", "mean_difference", "half_width", "better",
                  "n_seeds"]]


def with_planned_draws(bundle: Bundle, diffs: pd.DataFrame) -> pd.DataFrame:
    """``diffs`` (``claim_differences`` of ``bundle``) with a ``gap`` per row ('' when the draw holds every planned
    seed of both sides, else what it lacks: "draw 1: 3 of 5 seeds") and a row without numbers (``gap`` "draw 2
    missing") for each planned draw it has not begun: what a number made of part of the design must say."""
    if diffs.empty:
        return diffs
    planned = planned_finals(bundle)
    rows = []
    for (data, variant, counterpart, metric), group in diffs.groupby(["data", "variant", "counterpart", "metric"],
                                                                      sort=True):
        for draw in sorted(set(planned_draws(planned, data)) | set(group["draw"])):
            found = group[group["draw"] == draw]
            row = found.iloc[0].to_dict() if len(found) else {"data": data, "draw": draw, "variant": variant,
                                                               "counterpart": counterpart, "metric": metric}
            row["gap"] = draw_gap(planned, data, variant, counterpart, draw,
                                  float(row["n_seeds"]) if len(found) else None)
            rows.append(row)
    return pd.DataFrame(rows)


def over_draws(diffs: pd.DataFrame) -> pd.DataFrame:
    """``claim_differences`` summed up over the draws, per (data, variant, metric): the mean ``difference`` and the
    widest ``half_width`` (what the protocol could have resolved)."""
    return diffs.groupby(["data", "variant", "metric"]).agg(
        difference=("mean_difference", "mean"), half_width=("half_width", "max"))


def last_epoch_scores(bundle: Bundle) -> pd.DataFrame:
    """The final runs' test scores at the last epoch (splits ``test@last`` and ``test@last+<calibrator>``), shaped
    as ``final_scores`` shapes the selected checkpoint's (``baseline+ts`` a method, the split ``test``)."""
    runs = bundle.done()
    wide = wide_scores(bundle, runs[runs["role"] == "final"])
    last = wide[wide["split"].astype(str).str.startswith(LAST)].copy()
    posthoc = last["split"].str.startswith(LAST + "+")
    last.loc[posthoc, "method"] = last.loc[posthoc, "method"] + "+" + last.loc[posthoc, "split"].str[len(LAST) + 1:]
    return last.assign(split="test", draw=lambda f: f["draw"].fillna("").astype(str))


Bundles = dict[str, "Bundle | Sequence[Bundle]"]  # protocol -> its bundle, or its bundles (one per data set)


def _per_protocol(bundles: Bundles, table_of) -> dict[str, pd.DataFrame]:
    """``table_of`` of each protocol's bundles, concatenated; a data set in two bundles of one protocol is refused
    (which of its two campaigns would answer?)."""
    tables = {}
    for protocol, given in bundles.items():
        frames = [t for t in (table_of(b) for b in ([given] if isinstance(given, Bundle) else given)) if not t.empty]
        seen: set = set()
        for frame in frames:
            twice = seen & set(frame["data"])
            if twice:
                raise UserError(f"protocol {protocol}: data set {sorted(twice)[0]} is in two of its bundles; name "
                                "one bundle per data set and protocol.")
            seen |= set(frame["data"])
        tables[protocol] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return tables


def protocol_claims(bundles: Bundles) -> pd.DataFrame:
    """One row per (data set, claim, metric) with each protocol's answer, difference and half-width (see above)."""
    answers, numbers = {}, {}
    answer_tables, difference_tables = _per_protocol(bundles, claims), _per_protocol(bundles, claim_differences)
    for protocol in bundles:
        table, diffs = answer_tables[protocol], difference_tables[protocol]
        if table.empty:
            continue
        answers[protocol] = table.set_index(["data", "claim", "metric"])["answer"]
        if not diffs.empty:
            numbers[protocol] = over_draws(diffs)
    if not answers:
        return pd.DataFrame()
    keys = sorted(set().union(*(a.index for a in answers.values())))
    variant_of = {claim: variant for claim, variant, _, _ in paper_claims()}
    gains = claimed_gains()
    rows = []
    for data, claim, metric in keys:
        row = {"data": data, "claim": claim, "metric": metric}
        for protocol in bundles:
            row[protocol] = answers.get(protocol, pd.Series(dtype=str)).get((data, claim, metric), "")
            found = numbers.get(protocol)
            key = (data, variant_of[claim], metric)
            cell = found.loc[key] if found is not None and key in found.index else None
            row[f"{protocol} difference"] = np.nan if cell is None else float(cell["difference"])
            row[f"{protocol} ± (95 %)"] = np.nan if cell is None else float(cell["half_width"])
        if PAPER in bundles and FAIR in bundles:
            paper, fair = row[f"{PAPER} difference"], row[f"{FAIR} difference"]
            supported = claim in gains and row[PAPER] == SUPPORTED and np.isfinite(paper) and paper != 0
            complete = not str(row[FAIR]).startswith("incomplete")
            row["surviving share"] = fair / paper if supported and complete and np.isfinite(fair) else np.nan
        rows.append(row)
    order = {claim: i for i, (claim, *_) in enumerate(paper_claims())}
    table = pd.DataFrame(rows)
    return table.sort_values(["data", "claim", "metric"], key=lambda c: c.map(order) if c.name == "claim" else c,
                             kind="stable").reset_index(drop=True)


def power_claims() -> tuple[tuple[str, str, str], ...]:
    """(id, claim, variant) of the claims given a power figure (the hypotheses file's ``readings.power``: H1-H3;
    H4 is about MS's harm, not a calibration gain)."""
    hypotheses = load_hypotheses()
    return tuple((c.id, c.claim, c.variant) for c in hypotheses.claims if c.id in hypotheses.power)


POWER_SIMULATIONS, POWER_SEED = 20_000, 0  # Monte Carlo error of a probability: at most 0.0035 (one s.e.)


def supported_probability(effect: float, spreads: list[tuple[float, int]], sign: int) -> float:
    """P(the decision rule reads *supported*) when the true paired difference is ``sign * effect`` (``effect`` > 0;
    ``sign`` the claimed side) and draw k's seeds give normal differences of spread ``spreads[k] = (sd, seeds)``:
    each draw's 95 % t interval (``paired.seed_t_interval``) must exclude 0 on the claimed side. Seeded: the
    same bundles give the same probabilities."""
    if not effect > 0 or not spreads or any(not np.isfinite(sd) or n < 2 for sd, n in spreads):
        return np.nan
    rng = np.random.default_rng(POWER_SEED)
    every = np.ones(POWER_SIMULATIONS, dtype=bool)
    for sd, n in spreads:
        diffs = rng.normal(sign * effect, sd, size=(POWER_SIMULATIONS, n, 1))
        _, low, high = seed_t_interval(diffs)
        every &= (high < 0) if sign < 0 else (low > 0)
    return float(every.mean())


def _spread(row) -> float:
    """A draw's standard deviation of per-seed paired differences, from its interval's half-width."""
    n = int(row["n_seeds"])
    return float(row["half_width"]) * np.sqrt(n) / stats.t.ppf((1 + CONFIDENCE) / 2, n - 1) if n >= 2 else np.nan


def protocol_power(bundles: Bundles) -> pd.DataFrame:
    """Per protocol, data set and primary metric: post-hoc TS's gain on the baseline (mean over draws) and each
    claim's probability of reading *supported* for a gain that size (H1-H3; a claim the campaign does not run is
    left empty; module docstring)."""
    gains = _per_protocol(bundles, lambda b: with_planned_draws(b, claim_differences(b, TS_PAIR)))
    widths = _per_protocol(bundles, claim_differences)
    answers = _per_protocol(bundles, claims)
    rows = []
    for protocol in bundles:
        gain, width, answer = gains[protocol], widths[protocol], answers[protocol]
        if gain.empty or width.empty:
            continue
        for (data, metric), group in gain[gain["metric"].isin(POWER_METRICS)].groupby(["data", "metric"]):
            ts_gain = -float(group["mean_difference"].mean())  # > 0: TS lowers the metric
            row = {"protocol": protocol, "data": data, "metric": metric, "ts gain": ts_gain}
            measured = []
            for label, claim, variant in power_claims():
                draws = width[(width["data"] == data) & (width["metric"] == metric) & (width["variant"] == variant)]
                if not draws.empty:  # else not run by this campaign
                    measured.append(claim)
                sign = -1 if claim in claimed_gains() else 1  # H1, H2: the variant lower; H3: the variant higher
                spreads = [(_spread(r), int(r["n_seeds"])) for _, r in draws.iterrows()]
                row[f"{label} P(supported)"] = supported_probability(ts_gain, spreads, sign)
            pending = answer[(answer["data"] == data) & (answer["metric"] == metric)
                             & answer["claim"].isin(measured)]["answer"]
            gaps = [g for g in group["gap"] if g]  # the TS gain itself made of part of the planned runs
            notes = [*(["claims incomplete"] if pending.astype(str).str.startswith("incomplete").any() else []),
                     *([f"ts gain incomplete ({', '.join(gaps)})"] if gaps else [])]
            row["power note"] = "; ".join(notes)
            rows.append(row)
    return pd.DataFrame(rows)


def claim_pairs() -> dict[str, str]:
    """variant -> counterpart of every claim."""
    return {variant: counterpart for _, variant, counterpart, _ in paper_claims()}


# The plan's secondary readings, reported beside the claims and never decided on: (name, pairs, scores of a bundle)
SECONDARY = (
    ("last epoch", claim_pairs, last_epoch_scores),
    ("Guo's TS recipe", lambda: {"cog_ts": "baseline+ts_guo"}, final_scores),
)


def _secondary_differences(bundle: Bundle, pairs: dict[str, str], scores: pd.DataFrame) -> pd.DataFrame:
    """``claim_differences`` of ``scores`` with every planned draw (``with_planned_draws``) and ``reversed``: where
    a side is a post-hoc temperature that changed predictions in that draw (``bundle_answers.reversed_predictions``:
    Guo et al.'s recipe at a negative temperature), which a reading against it must say."""
    diffs = claim_differences(bundle, pairs, scores)
    if diffs.empty:
        return diffs
    diffs["reversed"] = ["; ".join(text for text in (reversed_predictions(scores, r.data, r.draw, method)
                                                      for method in (r.variant, r.counterpart)) if text)
                         for r in diffs.itertuples()]
    return with_planned_draws(bundle, diffs)


def _draw_cell(row) -> str:
    """One draw of a secondary reading: its side and seeds, marked while it lacks planned seeds or has not begun,
    and where a side's post-hoc temperature reversed predictions."""
    name = f"{row.draw}: " if row.draw else ""
    if "missing" in row.gap:
        return f"{name}not run yet"
    seeds = (f"{row.gap.split(': ', 1)[-1]}, incomplete" if row.gap else  # "draw 1: 3 of 5 seeds"
             f"{int(row.n_seeds)} seed{'' if row.n_seeds == 1 else 's'}")
    flipped = row.reversed if isinstance(row.reversed, str) and row.reversed else ""
    return f"{name}{row.better} ({seeds}" + (f"; {flipped})" if flipped else ")")


def protocol_secondary(bundles: Bundles) -> pd.DataFrame:
    """Per protocol, reading, data set, pair and primary metric: the difference (mean over draws), the widest
    half-width and each draw's side (``variant`` / ``counterpart`` / ``inconclusive``) with its seeds: a draw still
    running says ``incomplete`` and what it lacks, a draw not begun reads ``not run yet``."""
    rows = []
    for reading, pairs, scores_of in SECONDARY:
        chosen = pairs()
        tables = _per_protocol(bundles, lambda b, p=chosen, f=scores_of: _secondary_differences(b, p, f(b)))
        for protocol in bundles:
            table = tables[protocol]
            if table.empty:
                continue
            table = table[table["metric"].isin(POWER_METRICS)]
            for (data, variant, counterpart, metric), group in table.groupby(
                    ["data", "variant", "counterpart", "metric"], sort=True):
                group = group.sort_values("draw")
                rows.append({"protocol": protocol, "reading": reading, "data": data,
                             "pair": f"{variant} − {counterpart}", "metric": metric,
                             "difference": float(group["mean_difference"].mean()),
                             "± (95 %)": float(group["half_width"].max()),
                             "per draw": ", ".join(_draw_cell(r) for r in group.itertuples())})
    return pd.DataFrame(rows)
