"""The leader-rate curve: one COG method at a fixed follower rate, its leader/follower ratio on a log grid.

COG adds exactly one hyperparameter, the leader's learning rate (paper Sec. 3: the leader, slower,
is the calibrator or the classification layer). Under the fair protocol every head-leader COG
variant chose the highest ratio tried (1/2) and the highest follower rate: the search range
bound, and a ratio of 1 means *no* hierarchy (for COG-FC: the baseline, step for step, since
Adam is elementwise and both groups then share one rate). The curve looks at the whole range,
1e-3 up to and including 1, with the follower rate and every other setting held fixed, so that
"does the hierarchy help, and at which ratio" has an answer with intervals
(``mtl_cog/analysis/leader_curve.py``; ``scripts/leader_curve.py`` runs it).

This module holds the plan: the grid, and each run as a campaign spec (``mtl_cog.experiments.campaign``:
its folder name, overrides and labels). A curve drawn from a fair protocol's settings labels its runs with the
protocol's first tuning draw, and its reference arms are that draw's final runs: where the protocol's bundle
holds one with the same settings and seed, it is recorded into the curve's bundle instead of trained again
(``reuse_protocol_runs``).
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from filelock import FileLock

from mtl_cog.bundles.bundle import CURVE_COLUMNS, RESULT_COLUMNS, Bundle, bundle_dir, read_bundle
from mtl_cog.bundles.bundle_rows import CALIBRATOR_SPLIT, environment, result_splits, versions_text
from mtl_cog.errors import UserError
from mtl_cog.experiments.campaign import (
    BUNDLED,
    NEW,
    Collector,
    Labels,
    Planned,
    RunSpec,
    recorded_spec,
    run_name,
    setting_digest,
)

# log grid 1e-3 .. 1 (1, 3 per decade); 1 = no hierarchy, allowed here without the usual refusal
RATIOS = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
LEADER_KEY, FOLLOWER_KEY = "optim.leader_lr", "optim.follower_lr"
PROTOCOL_DRAW = "1"  # a curve takes the fair protocol's first tuning draw (labelled "" by a one-draw campaign)
FIRST_DRAWS = (PROTOCOL_DRAW, "")
ALLOW_EQUAL = "optim.allow_leader_lr_geq_follower=true"  # the schema refuses leader >= follower otherwise


def check_ratios(ratios: list[float]) -> list[float]:
    """Sorted, distinct ratios in (0, 1]; a leader faster than its follower inverts COG's hierarchy."""
    bad = [r for r in ratios if not (math.isfinite(r) and 0 < r <= 1)]
    if bad or not ratios:
        raise UserError(f"--ratios must be numbers in (0, 1] (leader rate / follower rate). Got {bad or 'none'}.")
    distinct = sorted(set(ratios))
    names: dict[str, float] = {}
    for ratio in distinct:  # a run folder names its ratio with 6 significant digits (campaign.run_name)
        name = run_name(ratio=ratio)
        if name in names:
            raise UserError(f"--ratios {names[name]!r} and {ratio!r} agree to 6 significant digits, so their runs "
                            f"would share the folder name {name}; give ratios that differ in the first 6 digits.")
        names[name] = ratio
    return distinct


def curve_overrides(follower_lr: float, ratio: float) -> list[str]:
    """Follower fixed, leader = ratio x follower (exactly the follower's rate at ratio 1)."""
    leader = follower_lr if ratio == 1 else ratio * follower_lr
    return [f"{FOLLOWER_KEY}={follower_lr:.6g}", f"{LEADER_KEY}={leader:.6g}", *([ALLOW_EQUAL] if ratio >= 1 else [])]


# The settings a final run of the protocol composes, minus what the curve sets itself.
CURVE_OWNED = ("seed=", "output_dir=", "run_name=", "tracking=", "wandb_group=", "wandb_job_type=")


def protocol_run_source(protocol_dir: Path, dataset: str, method: str) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """(config files, overrides) of the fair protocol's final run of (dataset, method): its tuned settings.

    Every final run of a method (first tuning draw) has the same settings but its seed, so one stands for all:
    its resolved ``config.yaml`` where the run folder exists, else what the protocol's results bundle
    records of it (a fresh clone holding only the committed bundle).
    """
    runs = sorted((protocol_dir / "runs").glob(f"{dataset}-{method}-seed*/config.yaml"))
    if runs:
        return (runs[0],), ()
    bundle = read_bundle(bundle_dir(protocol_dir))
    if bundle is not None:
        rows = bundle.runs[(bundle.runs["role"] == "final") & (bundle.runs["data"] == dataset)
                           & (bundle.runs["method"] == method) & (bundle.runs["draw"].astype(str).isin(FIRST_DRAWS))]
        for run in sorted(rows["run"]):
            source = recorded_spec(bundle, run)
            if source is not None:
                return source[0], tuple(o for o in source[1] if not o.startswith(CURVE_OWNED))
    chosen = protocol_dir / "report" / "chosen_settings.csv"
    hint = f" ({chosen} exists: its final runs have not started)" if chosen.is_file() else ""
    raise UserError(f"--protocol-dir {protocol_dir}: no final run of {dataset}/{method} "
                    f"(runs/{dataset}-{method}-seed*/config.yaml, or its results bundle){hint}; finish "
                    "`reproduce --protocol fair` for it first, or give --follower-lr instead.")


def chosen_edges(protocol_dir: Path, dataset: str, method: str) -> str:
    """The protocol's ``at_edge`` note for (dataset, method), '' when none or no report yet."""
    path = protocol_dir / "report" / "chosen_settings.csv"
    if not path.is_file():
        return ""
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row.get("dataset") == dataset and row.get("method") == method:
                return row.get("at_edge") or ""
    return ""


Source = tuple[tuple[Path, ...], tuple[str, ...]]  # (config files, overrides) a run composes before the curve's


def plan(method: str, dataset: str, source: Source, references: dict[str, Source], follower_lr: float,
         ratios: list[float], seeds: list[int], runs_dir: Path, extra: list[str], shared_rate: bool,
         counterpart: str = "", draw: str = "") -> list[RunSpec]:
    """Every run of the curve: ``method`` at each ratio x seed, each reference method x seed (the baseline's runs
    also fit post-hoc TS, the band ``baseline+ts``).

    ``extra``: the user's overrides, applied to every run after its source's and before the curve's own (which
    win); ``shared_rate``: the references train at ``follower_lr`` too (else at their own, e.g. tuned, rate);
    ``draw``: the tuning draw the settings come from ("1" from a fair protocol, "" from a config).
    """
    configs, tuned = source
    runs = [RunSpec(run_name(method=method, ratio=ratio, seed=seed), configs,
                    (*tuned, *extra, *curve_overrides(follower_lr, ratio), f"seed={seed}", "tracking=none"),
                    runs_dir / run_name(method=method, ratio=ratio, seed=seed),
                    Labels(dataset, method, "curve", seed, draw, ratio=ratio))
            for ratio in ratios for seed in seeds]
    rate = (f"{FOLLOWER_KEY}={follower_lr:.6g}",) if shared_rate else ()
    # the baseline band's post-hoc TS, and the method's own post-hoc counterpart (COG-VS: baseline+vs)
    baseline_posthoc = tuple(dict.fromkeys(["ts", *([counterpart.split("+", 1)[1]] if "+" in counterpart else [])]))
    runs += [RunSpec(run_name(method=name, seed=seed), paths, (*ref_tuned, *extra, *rate, f"seed={seed}",
                                                                "tracking=none"),
                     runs_dir / run_name(method=name, seed=seed), Labels(dataset, name, "curve", seed, draw),
                     posthoc=baseline_posthoc if name == "baseline" else ())
             for name, (paths, ref_tuned) in references.items() for seed in seeds]
    return runs


def read_protocol_bundle(protocol_dir: Path) -> Bundle | None:
    """The protocol's results bundle, read under its lock where it has one; None (with a warning) when it is
    missing or damaged: the curve then trains its reference arms itself."""
    lock = Path(protocol_dir) / "bundle.lock"
    try:
        if lock.is_file():
            with FileLock(str(lock)):
                return read_bundle(bundle_dir(protocol_dir))
        return read_bundle(bundle_dir(protocol_dir))
    except UserError as err:
        print(f"warning: --protocol-dir {protocol_dir}: its bundle cannot be read ({err}); the reference runs are "
              "trained here instead.", file=sys.stderr)
        return None


def protocol_matches(planned: list[Planned], protocol: Bundle | None, threads: int) -> dict[str, str]:
    """{curve run: protocol run} for each reference run of the curve not started yet whose twin the protocol's
    bundle holds: a finished final run of its first draw, of the same data set, with the same settings
    (``setting_digest``: every setting but the seed and the folder's name) and seed, trained with the same torch
    threads and library versions as this curve's runs, and holding every post-hoc calibrator the curve fits on
    it. That is the same run (training is deterministic at a fixed thread count), so the curve need not train it
    again; anything else (another thread count, torch version, a draw-2 run) is trained here."""
    if protocol is None:
        return {}
    runs = protocol.done()
    finals = runs[(runs["role"] == "final") & runs["draw"].astype(str).isin(FIRST_DRAWS)
                  & (runs["threads"].astype(str) == str(threads))
                  & (runs["versions"].astype(str) == versions_text(environment()))]
    specs = protocol.campaign.get("specs", {})
    twins = {(str(data), specs[run].get("setting"), str(seed)): run
             for run, data, seed in zip(finals["run"], finals["data"], finals["seed"])
             if isinstance(specs.get(run), dict)}
    splits = protocol.results.groupby("run")["split"].agg(set).to_dict()
    matches = {}
    for p in planned:
        if p.spec.labels.ratio is not None or p.state != NEW:
            continue
        twin = twins.get((p.spec.labels.data, setting_digest(p.config), str(p.spec.labels.seed)))
        if twin is not None and set(result_splits(p.spec.posthoc)) <= splits.get(twin, set()):
            matches[p.spec.run] = twin
    return matches


def reuse_protocol_runs(planned: list[Planned], protocol: Bundle, matches: dict[str, str],
                        collector: Collector) -> None:
    """Record the protocol's twins of the curve's reference runs (``protocol_matches``) into the curve's bundle:
    their runs.csv row (commit, versions, threads and wall time as the protocol ran them) and results (the
    splits the curve's own run would have), under the curve's run names and labels; ``campaign.json``'s
    ``reused`` names where each came from (a run trained here later leaves it)."""
    by_name = {p.spec.run: p for p in planned}

    def change(bundle: Bundle) -> None:
        for run, twin in matches.items():
            row = {**protocol.runs[protocol.runs["run"] == twin].iloc[0].to_dict(), **collector.labels_of(by_name[run])}
            keep = {*result_splits(by_name[run].spec.posthoc), CALIBRATOR_SPLIT}
            results = protocol.results[(protocol.results["run"] == twin) & protocol.results["split"].isin(keep)]
            curves = protocol.curves[protocol.curves["run"] == twin]
            bundle.add_run(row, results.assign(run=run)[RESULT_COLUMNS], curves.assign(run=run)[CURVE_COLUMNS])
            bundle.campaign.setdefault("reused", {})[run] = {"campaign": protocol.name, "run": twin}

    collector.update(change)
    for run in matches:
        by_name[run].state = BUNDLED
