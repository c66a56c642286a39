"""The answer tables of a campaign's results bundle: what the final runs say, against what was planned.

- ``summary`` / ``summary_cells``: per data set, tuning draw and method, the test metrics' task mean, mean ± std
  over the final runs' seeds (the COG paper's Table 1 layout), the seed count against the planned one
  (``planned_finals``) and a ``note`` (incomplete; a calibrator never exercised); final runs only (role
  ``final``): a sweep's or a curve's runs differ in their settings and have their own tables;
- ``paired``: each COG variant minus its counterpart (``campaign.json``'s ``counterparts``), paired by seed,
  95 % t interval over seeds (``analysis/paired.py``), per draw;
- ``verdicts``: the planned draws' verdicts side by side: ``settled`` when every draw says the same, **depends on
  the tuning draw** when the draws disagree, ``incomplete`` while a draw lacks the pair or some of its planned
  seeds, *not tested at this budget* where the variant's calibrator stayed at the identity;
- ``calibrators``: every learned calibrator's final values, distance from the identity (where it started) and its
  move after epoch 1;
  ``exercised`` is false where it stayed within 1 % of the identity (then the method was not tested at this
  budget, and the summary, verdicts and claims say so instead of ranking it);
- ``claims``: the COG paper's qualitative claims (``paper_claims``: ``configs/hypotheses/cog_paper.yaml``), each a
  paired comparison of final runs, marked per metric *supported* / *contradicted* / *inconclusive at this scale*
  when every draw agrees, **depends on the tuning draw** when they do not, *not tested at this budget* where a
  learned calibrator stayed at the identity, *incomplete* while a side lacks planned draws or seeds; a draw with one
  shared seed reads *no interval (one seed)* (``interval_reading``), in the verdicts too;
- both: **does not test COG (schedule)** where the variant's rate schedule annealed before it could learn: every
  final run of the draw held its follower rate at >= 1/10 of the first epoch's for fewer than ``MIN_LIVE_SHARE``
  of its epochs (``curves.csv.gz``'s ``lr``). The paper's own schedule keeps that live phase for about 3,100
  (CIFAR-10) to 3,800 (CelebA) steps, longer than its networks need to reach their best validation NLL; scaled by
  its epoch share to 30 epochs it keeps 2 of them (40-80 steps), and a claim read there measures the schedule.
  The draw's reading stays beside it, with its numbers.
- both: **no answer (draw K of N alone)** for a campaign that ran one draw of a design with several
  (``reproduce --draws N --only-draw K``, ``one_draw_of``): the decision rule needs every draw, so one draw gives a
  per-draw reading (beside it), not an answer, even where that reading would read as one.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from mtl_cog.analysis.hypotheses import load_hypotheses
from mtl_cog.analysis.paired import INCONCLUSIVE, PAIRED_METRICS, paired_differences
from mtl_cog.bundles.bundle import Bundle, wide_scores
from mtl_cog.bundles.bundle_rows import CALIBRATOR_SPLIT
from mtl_cog.bundles.trajectories import live_epoch_count
from mtl_cog.constants import IDENTITY_TOLERANCE, IDENTITY_VALUES
from mtl_cog.evaluation.posthoc import POSTHOC

SUMMARY_METRICS = ("accuracy", "nll", "brier", "ece@15")
SETTLED, DEPENDS = "settled", "depends on the tuning draw"
ONE_DRAW = "no answer"
# A positive temperature keeps every argmax, so both accuracies are the same count of the same predictions, stored
# at 8 significant digits from one computation: equal unless a prediction changed (at least 1/N apart).
ACCURACY_KEPT_TOLERANCE = 1e-9


def final_scores(bundle: Bundle) -> pd.DataFrame:
    runs = bundle.done()
    # final runs only: a curve's or a sweep's runs differ in their settings and must never be pooled in one mean
    finals = runs[runs["role"] == "final"]
    scores = wide_scores(bundle, finals)
    return scores[scores["split"] == "test"].assign(draw=lambda f: f["draw"].fillna("").astype(str))


def _trained(method: str) -> str:
    """The trained method behind a report method: ``baseline+ts`` is post-hoc TS fitted on ``baseline``'s runs."""
    return method.split("+", 1)[0]


def planned_labels(bundle: Bundle) -> list[dict]:
    """The labels (role, data, method, draw, seed...) ``campaign.json`` records of every planned run; none in a
    bundle written before it recorded them."""
    return [r["labels"] for r in bundle.campaign.get("specs", {}).values()
            if isinstance(r, dict) and isinstance(r.get("labels"), dict)]


def planned_finals(bundle: Bundle) -> pd.DataFrame:
    """Every *planned* final run as (data, method, draw, seed): what a complete campaign will have.

    ``campaign.json`` records each planned run's labels; a bundle written before it did (no ``labels``) is read
    from what exists: per data set, every method with a final run × every draw that has final runs or a tuning
    study × every seed that some final run has. A table then says ``incomplete`` while a (method, draw) has fewer
    seeds than planned, instead of reading the finished ones as the whole design.
    """
    labelled = planned_labels(bundle)
    if labelled:
        frame = pd.DataFrame(labelled)
        frame = frame[frame["role"] == "final"]
        return (frame.assign(draw=frame["draw"].fillna("").astype(str), seed=frame["seed"].astype(int))
                [["data", "method", "draw", "seed"]].drop_duplicates().reset_index(drop=True))
    finals = bundle.runs[bundle.runs["role"] == "final"]
    draws = set(finals["draw"].fillna("").astype(str))
    if not bundle.trials.empty and "draw" in bundle.trials:
        draws |= {str(d) for d in bundle.trials["draw"].dropna()}
    rows = [{"data": data, "method": method, "draw": draw, "seed": int(seed)}
            for data, group in finals.groupby("data") for method in sorted(set(group["method"]))
            for draw in sorted(draws) for seed in sorted(set(group["seed"].astype(int)))]
    return pd.DataFrame(rows, columns=["data", "method", "draw", "seed"])


def _planned_seeds(planned: pd.DataFrame, data: str, method: str, draw: str) -> int:
    rows = planned[(planned["data"] == data) & (planned["method"] == _trained(method)) & (planned["draw"] == draw)]
    return int(rows["seed"].nunique())


def one_draw_of(campaign: dict) -> tuple[int, int] | None:
    """(K, N) where the campaign ran draw K alone of a design of N > 1 draws, from ``campaign.json``'s command
    (``--only-draw K`` with ``--draws N``) or, for a campaign combined from others, their recorded ``one_draw_of``;
    None for a whole design."""
    if campaign.get("one_draw_of"):
        k, n = campaign["one_draw_of"]
        return int(k), int(n)
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    flags.add_argument("--draws", type=int)
    flags.add_argument("--only-draw", type=int)
    try:  # read as reproduce read it: --draws=2 too, the last of a repeated flag
        known, _ = flags.parse_known_args([str(c) for c in campaign.get("command") or []])
    except argparse.ArgumentError:  # not a whole number: reproduce refused such a command
        return None
    return (known.only_draw, known.draws) if known.only_draw and known.draws and known.draws > 1 else None


def planned_draws(planned: pd.DataFrame, data: str) -> list[str]:
    return sorted(set(planned.loc[planned["data"] == data, "draw"]))


def summary(bundle: Bundle, calibrator_table: pd.DataFrame | None = None,
            planned: pd.DataFrame | None = None) -> pd.DataFrame:
    scores = final_scores(bundle)
    means = scores[scores["task"] == "mean"]
    planned = planned_finals(bundle) if planned is None else planned
    table = calibrators(bundle) if calibrator_table is None else calibrator_table
    rows = []
    for (data, draw, method), group in means.groupby(["data", "draw", "method"], sort=True):
        seeds = group["seed"].nunique()
        row = {"data": data, "draw": draw, "method": method, "seeds": seeds,
               "planned_seeds": max(_planned_seeds(planned, data, method, draw), seeds)}
        for metric in [m for m in SUMMARY_METRICS if m in group]:  # a metric the campaign did not record: no column
            values = group[metric].to_numpy(dtype=float)
            row[metric] = values.mean()
            row[f"{metric}_std"] = values.std(ddof=1) if len(values) > 1 else np.nan
        notes = []
        if seeds < row["planned_seeds"]:
            notes.append(f"incomplete: {seeds} of {row['planned_seeds']} seeds "
                         f"({', '.join(map(str, sorted(group['seed'].unique())))})")
        reversed_note = reversed_predictions(scores, data, draw, method)
        if reversed_note:
            notes.append(reversed_note)
        if _idle(table, data, method, draw):
            notes.append(f"{NOT_TESTED}: its calibrator stayed within {IDENTITY_TOLERANCE:.0%} of the identity")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows)


def reversed_predictions(scores: pd.DataFrame, data: str, draw: str, method: str) -> str:
    """Where a post-hoc method that keeps every prediction (``keeps_predictions``: a positive temperature) changed
    a task's test accuracy: its fit reversed that task's predictions (Guo et al.'s recipe can end at a negative
    temperature), which moves every metric of the row. -> "<method> changed predictions (a temperature keeps
    them unless negative): <task> (seeds 0, 2); ..." or ''. A task at exactly 0.5 accuracy hides a reversal."""
    trained, _, posthoc = method.partition("+")
    if not posthoc or posthoc not in POSTHOC or not POSTHOC.get(posthoc).keeps_predictions:
        return ""
    rows = scores[(scores["data"] == data) & (scores["draw"] == draw) & (scores["task"] != "mean")]
    if "accuracy" not in rows:
        return ""
    before = rows[rows["method"] == trained].set_index(["seed", "task"])["accuracy"]
    after = rows[rows["method"] == method].set_index(["seed", "task"])["accuracy"]
    changed = (after - before.reindex(after.index)).abs() > ACCURACY_KEPT_TOLERANCE
    if not changed.any():
        return ""
    seeds_of: dict[str, list] = {}
    for seed, task in sorted(changed[changed].index, key=lambda pair: (pair[1], pair[0])):
        seeds_of.setdefault(task, []).append(seed)
    named = "; ".join(f"{task} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
                      for task, seeds in list(seeds_of.items())[:4])
    more = f"; {len(seeds_of) - 4} more task(s)" if len(seeds_of) > 4 else ""
    return f"{posthoc} changed predictions (a temperature keeps them unless negative): {named}{more}"


def summary_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``summary`` as the paper prints it: "mean ± std" per metric; seeds as "2 of 3" while some are missing."""
    out = table[["data", "draw", "method"]].copy()
    out["seeds"] = [str(n) if n >= planned else f"{n} of {planned}"
                    for n, planned in zip(table["seeds"], table["planned_seeds"])]
    for metric in [m for m in SUMMARY_METRICS if m in table]:
        out[metric] = [f"{m:.4f}" + ("" if pd.isna(s) else f" ± {s:.4f}") for m, s in
                       zip(table[metric], table[f"{metric}_std"])]
    out["note"] = table["note"]
    return out


def paired(bundle: Bundle) -> pd.DataFrame:
    scores = final_scores(bundle)
    pairs = dict(bundle.campaign.get("counterparts", {}))
    frames = []
    for draw, group in scores.groupby("draw", sort=True):
        table = paired_differences(group.rename(columns={"data": "dataset"}), pairs, PAIRED_METRICS)
        frames.append(table.assign(draw=draw))
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    return table[["dataset", "draw", *[c for c in table.columns if c not in ("dataset", "draw")]]]


def draw_gap(planned: pd.DataFrame, data: str, variant: str, counterpart: str, draw: str,
              n_seeds: float | None) -> str:
    """'' when the draw's pair holds every planned seed of both sides; else what it lacks ("draw 2: 1 of 3
    seeds", "draw 2 missing")."""
    want = min(_planned_seeds(planned, data, variant, draw), _planned_seeds(planned, data, counterpart, draw))
    if n_seeds is None:
        return f"draw {draw} missing" if draw else "missing"
    if want and np.isfinite(n_seeds) and int(n_seeds) < want:
        return f"{'draw ' + draw + ': ' if draw else ''}{int(n_seeds)} of {want} seeds"
    return ""


def verdicts(paired_table: pd.DataFrame, planned: pd.DataFrame | None = None,
             calibrator_table: pd.DataFrame | None = None, bundle: Bundle | None = None) -> pd.DataFrame:
    """One row per (data set, variant, counterpart, metric): each planned draw's verdict and whether they agree.

    ``answer`` is a draw's verdict when every planned draw gives the same (``status`` settled), **depends on the
    tuning draw** when they differ, ``incomplete (...)`` while a draw lacks the pair or some of its planned seeds,
    and *not tested at this budget* where the variant's learned calibrator stayed at the identity in a draw."""
    if paired_table.empty:
        return pd.DataFrame()
    planned = pd.DataFrame(columns=["data", "method", "draw", "seed"]) if planned is None else planned
    calibrator_table = pd.DataFrame() if calibrator_table is None else calibrator_table
    annealed = {} if bundle is None else annealed_early(bundle)
    part = None if bundle is None else one_draw_of(bundle.campaign)
    rows = []
    keys = ["dataset", "variant", "counterpart", "metric"]
    for key, group in paired_table.groupby(keys, sort=True):
        data, variant, counterpart, _ = key
        by_draw = {str(r.draw): r for r in group.itertuples()}
        draws = sorted(set(planned_draws(planned, data))
                       | set(paired_table.loc[paired_table["dataset"] == data, "draw"].astype(str)))
        row, cells, gaps = dict(zip(keys, key)), [], []
        for draw in draws:
            found = by_draw.get(draw)
            seeds = None if found is None else float(getattr(found, "n_seeds", np.inf))
            gap = draw_gap(planned, data, variant, counterpart, draw, seeds)
            cell = "" if found is None else interval_reading(found)
            if found is not None and _idle(calibrator_table, data, variant, draw):
                cell = f"{NOT_TESTED} ({cell})"
            if found is not None and variant in annealed.get((data, draw), ()):
                cell = f"{SCHEDULE_BLIND} ({cell})"
            if gap and found is not None:
                cell = f"{cell} ({gap})"
            row[f"draw {draw}" if draw else "verdict"] = cell
            cells.append(cell)
            if gap:
                gaps.append(gap)
        row["answer"], row["status"] = _answer(cells, gaps, part)
        rows.append(row)
    return pd.DataFrame(rows)


def _answer(readings: list[str], gaps: list[str], part: tuple[int, int] | None = None) -> tuple[str, str]:
    """(answer, status) of one comparison from its draws' readings: incomplete while a draw lacks planned runs,
    no answer where the campaign ran one draw of several (``part``: ``one_draw_of``), not tested where a draw's
    calibrator stayed at the identity, the reading when every draw agrees, else it depends on the tuning draw. The
    one rule of verdicts and claims."""
    if gaps:
        return f"incomplete ({', '.join(gaps)})", "incomplete"
    if part is not None:
        return f"{ONE_DRAW} (draw {part[0]} of {part[1]} alone)", ONE_DRAW
    if any(r.startswith(SCHEDULE_BLIND) for r in readings):  # a calibrator idle under it: the schedule's doing
        return SCHEDULE_BLIND, SCHEDULE_BLIND
    if any(r.startswith(NOT_TESTED) for r in readings):
        return NOT_TESTED, NOT_TESTED
    if len(set(readings)) == 1:
        return readings[0], SETTLED
    return DEPENDS, DEPENDS


def calibrators(bundle: Bundle) -> pd.DataFrame:
    """Per run with a learned calibrator: its final values (min / median / max), the largest distance from the
    identity (where COG starts it: its move from the start), its move after epoch 1 (from the first state the run
    records, the end of epoch 1, to the last: the part the convergence rule judges), and whether it was exercised
    at all (moved >= 1 % from identity)."""
    runs = bundle.done()
    rows = bundle.results[(bundle.results["split"] == CALIBRATOR_SPLIT) & bundle.results["run"].isin(set(runs["run"]))]
    out = []
    labels = runs.set_index("run")
    for (run, parameter), group in rows.groupby(["run", "metric"], sort=True):
        values = group["value"].to_numpy(dtype=float)
        identity = IDENTITY_VALUES.get(parameter)
        distance = float(np.abs(values - identity).max()) if identity is not None else np.nan
        move = bundle.curves[(bundle.curves["run"] == run) & (bundle.curves["split"] == "calibrator")
                             & (bundle.curves["metric"] == "from_last")].sort_values("epoch")["value"]
        row = labels.loc[run]
        out.append({"data": row["data"], "draw": "" if pd.isna(row["draw"]) else str(row["draw"]),
                    "method": row["method"], "role": row["role"], "ratio": row["ratio"], "seed": row["seed"],
                    "parameter": parameter, "min": values.min(), "median": float(np.median(values)),
                    "max": values.max(), "from_identity": distance,
                    "move_after_epoch_1": float(move.iloc[0]) if len(move) else np.nan,
                    "exercised": bool(distance >= IDENTITY_TOLERANCE) if identity is not None else True})
    return pd.DataFrame(out)




def paper_claims() -> tuple[tuple[str, str, str, str], ...]:
    """The claims a campaign's final runs are read against, (claim, variant, counterpart, the side the paper says
    wins), from the hypotheses file (``analysis/hypotheses.py``, ``configs/hypotheses/cog_paper.yaml``)."""
    return tuple(c.as_tuple for c in load_hypotheses().claims)


def claim_metrics() -> tuple[str, ...]:
    """The metrics every claim is read on (the hypotheses file's ``metrics``)."""
    return load_hypotheses().metrics


SUPPORTED, CONTRADICTED, NOT_DECIDED = "supported", "contradicted", "inconclusive at this scale"
NOT_TESTED = "not tested at this budget"
SCHEDULE_BLIND = "does not test COG (schedule)"
MIN_LIVE_SHARE = 0.5  # a schedule whose rate is live for less of the run than this has annealed before COG learns
NO_INTERVAL = "no interval (one seed)"  # one shared seed: a difference, but nothing to read it against


def interval_reading(row) -> str:
    """A paired row's ``better`` (variant / counterpart / inconclusive), or ``NO_INTERVAL`` where one shared seed
    gave no interval: "inconclusive" would say an interval straddles 0, and there is none."""
    low = getattr(row, "ci_low", 0.0)  # a table that gives only the verdicts: read as given
    return NO_INTERVAL if pd.isna(low) else str(row.better)


def _side(better: str, expected: str) -> str:
    """A paired verdict read against the paper's claim."""
    if better == INCONCLUSIVE:
        return NOT_DECIDED
    return SUPPORTED if better == expected else CONTRADICTED


def annealed_early(bundle: Bundle) -> dict[tuple[str, str], set[str]]:
    """(data, draw) -> the methods with a leader whose every final run there was live (``live_epoch_count``) for
    fewer than ``MIN_LIVE_SHARE`` of its epochs; runs whose rate the bundle does not record are not judged."""
    runs = bundle.done()
    finals = runs[(runs["role"] == "final") & runs["method"].astype(str).str.startswith("cog")]
    rates = bundle.curves[(bundle.curves["split"] == "train") & (bundle.curves["metric"] == "lr")]
    shares = {run: live_epoch_count(g.sort_values("epoch")["value"].to_numpy()) / len(g)
              for run, g in rates[rates["run"].isin(set(finals["run"]))].groupby("run") if len(g)}
    out: dict[tuple[str, str], set[str]] = {}
    for (data, method, draw), group in finals.groupby(["data", "method", finals["draw"].fillna("").astype(str)]):
        known = [shares[r] for r in group["run"] if r in shares]
        if known and len(known) == len(group) and max(known) < MIN_LIVE_SHARE:
            out.setdefault((str(data), draw), set()).add(str(method))
    return out


def _idle(table: pd.DataFrame, data: str, method: str, draw: str) -> bool:
    """Whether every final run of (data, method, draw) with a learned calibrator left it at the identity."""
    if table.empty:
        return False
    learned = table[(table["data"] == data) & (table["method"] == method) & (table["role"] == "final")
                    & (table["draw"] == draw)]
    return not learned.empty and not learned["exercised"].any()


def claims(bundle: Bundle, calibrator_table: pd.DataFrame | None = None,
           planned: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (data set, claim, metric): each planned draw's reading of the paper's claim and the answer."""
    scores = final_scores(bundle)
    if scores.empty:
        return pd.DataFrame()
    table = calibrators(bundle) if calibrator_table is None else calibrator_table
    planned = planned_finals(bundle) if planned is None else planned
    pairs = {variant: counterpart for _, variant, counterpart, _ in paper_claims()}  # one counterpart each
    annealed = annealed_early(bundle)
    part = one_draw_of(bundle.campaign)
    rows = []
    for data in sorted(scores["data"].unique()):
        draws = sorted(set(planned_draws(planned, data)) | set(scores.loc[scores["data"] == data, "draw"]))
        readings = {}  # draw -> (variant, metric) -> its paired row: every claim's pair in one pass per draw
        for draw in draws:
            group = scores[(scores["data"] == data) & (scores["draw"] == draw)]
            pair = paired_differences(group.rename(columns={"data": "dataset"}), pairs, claim_metrics())
            readings[draw] = {(r.variant, r.metric): r for r in pair.itertuples()}
        for claim, variant, counterpart, expected in paper_claims():
            for metric in claim_metrics():
                row = {"data": data, "claim": claim, "pair": f"{variant} − {counterpart}", "metric": metric}
                sides, gaps = [], []
                for draw in draws:
                    r = readings[draw].get((variant, metric))
                    gap = draw_gap(planned, data, variant, counterpart, draw, None if r is None else float(r.n_seeds))
                    side, text = "", ""
                    if r is not None:
                        if pd.isna(r.ci_low):
                            side, text = NO_INTERVAL, f"{NO_INTERVAL} ({r.mean_difference:+.4f})"
                        else:
                            side = _side(r.better, expected)
                            text = f"{side} ({r.mean_difference:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}])"
                        if _idle(table, data, variant, draw):  # its calibrator never left the identity
                            side, text = NOT_TESTED, f"{NOT_TESTED} ({text})"
                        if variant in annealed.get((data, draw), ()):  # its schedule annealed before it learnt
                            side, text = SCHEDULE_BLIND, f"{SCHEDULE_BLIND} ({text})"
                    if gap:
                        gaps.append(gap)
                        text = f"{text} ({gap})" if text else ""
                    row[f"draw {draw}" if draw else "reading"] = text
                    sides.append(side)
                row["answer"] = _answer(sides, gaps, part)[0]
                rows.append(row)
    return pd.DataFrame(rows)
