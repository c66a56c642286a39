"""The rules a campaign's tuning studies keep across draws and re-tunings (``reproduce``, fair and paper protocols).

- ``check_start_rule``: a bundle's recorded studies must search the knobs this command's studies search (pinned or
  not) and start from the points its rule draws (shifted per draw, or unshifted under ``--legacy-tuning``), refused
  before anything runs, dry runs included;
- ``recorded_rules``: a study resumes under the tuning rule its bundle records (``tuning_rule``); methods compared
  in one data set and draw are tuned under one rule;
- ``widen``: after a choice sat at a range edge, new studies over the widened range (``--widen``: every method of
  that data set and draw alike; the legacy rule: the method at the edge alone).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from mtl_cog.bundles import bundle as bundles
from mtl_cog.config import search_ranges
from mtl_cog.config.schema import MAX_SEED, check_seed
from mtl_cog.errors import UserError
from mtl_cog.experiments import fair_tuning, protocol, tuning
from mtl_cog.experiments.tuning_rule import TuningRule, rule_of_row

Studies = dict[tuple[str, str, str], tuning.StudySpec]  # (data, method, draw) -> study


def check_start_rule(studies: Studies, recorded: bundles.Bundle | None, budget: int) -> None:
    """Refuse, before anything runs (dry runs included), studies whose recorded start points are not the ones this
    campaign's rule draws (``--legacy-tuning`` or not, another sampler seed): their trials would be ranked with
    trials of another search, and ``tuning.enqueue_start`` would refuse them only once the tuning starts."""
    if recorded is None or recorded.trials.empty or "study" not in recorded.trials:
        return
    for spec in studies.values():
        rows = recorded.trials[recorded.trials["study"] == spec.name].sort_values("trial")
        check_same_knobs(spec, rows)
        starts = protocol.start_points(list(spec.knobs), tuning.start_count(budget), spec.sampler_seed, spec.rotation)
        for row, point in zip(rows.to_dict("records"), starts):
            held = {key: pd.to_numeric(row.get(key), errors="coerce") for key in point}
            if any(not math.isclose(float(held[key]), value, rel_tol=1e-6) for key, value in point.items()):
                rule = "shifted start points" if spec.rotate else "unshifted start points (--legacy-tuning)"
                raise UserError(f"the results bundle's study {spec.name} starts from trial {row.get('trial')} at "
                                f"{ {k: float(v) for k, v in held.items()} }, not at {point}, where this command's "
                                f"rule ({rule}) starts: it was tuned under another rule. A campaign tuned before "
                                "2026-12-04 resumes with --legacy-tuning; otherwise use a new --out.")


def check_same_knobs(spec: tuning.StudySpec, rows: pd.DataFrame) -> None:
    """Refuse a recorded study that searched other knobs or ranges than this command's study of that name, or held
    a pinned knob (``--pin-to``) at another value: its start points could not be compared, and its trials would be
    ranked with trials of another search. Read from the bundle's rows alone (``ranges``: the searched knobs;
    ``overrides``: the values each trial ran with), so a dry run refuses it too."""
    tail = ("Resume it with the command that made it (the bundle's campaign.json records it, `command`), or use a "
            "new --out.")
    held = rows["ranges"].dropna() if "ranges" in rows else pd.Series(dtype=object)
    mine = search_ranges.ranges_text(list(spec.knobs))
    if not held.empty and str(held.iloc[0]) != mine:  # no ranges: a bundle from before they were recorded
        theirs = {token.split("=", 1)[0] for token in str(held.iloc[0]).split()}
        ours = {knob.key for knob in spec.knobs}
        why = (f"this command pins {', '.join(sorted(theirs - ours))}, which the recorded study searched"
               if ours < theirs else
               f"the recorded study held {', '.join(sorted(ours - theirs))} fixed (pinned), which this command "
               "searches" if theirs < ours else
               "the same knobs over other ranges, or other knobs: another --scale, protocol or data set config")
        raise UserError(f"the results bundle's study {spec.name} searched {held.iloc[0]}; this command's study of "
                        f"that name searches {mine} ({why}). {tail}")
    ran = [search_ranges.knob_values(text) for text in (rows["overrides"].dropna() if "overrides" in rows else [])]
    for key, value in spec.pinned:
        other = sorted({o[key] for o in ran if key in o and not math.isclose(o[key], value, rel_tol=1e-6)})
        if other:
            raise UserError(f"the results bundle's study {spec.name} ran with {key} at {other[0]:g}; this command "
                            f"pins it at {value:g} (the --pin-to bundle's choice changed, or another --pin-to): its "
                            f"trials would be ranked with trials of another pinning. {tail}")


def recorded_rules(studies: Studies, recorded: bundles.Bundle | None, rule: TuningRule,
                   epoch_budget_given: bool) -> Studies:
    """Each study with the rule it is tuned under: ``rule`` (this command's) for a study the bundle does not record
    yet, the recorded one for a study it does, which resumes under the rule it was tuned with.

    Refused, before anything runs: a ``--epoch-budget`` given that differs from a recorded study's (it would not
    take effect), and methods of one data set and draw under different rules (their choices would rest on budgets
    spent differently: a campaign tuned before 2026-12-06 extended by a new method or draw; use a new --out)."""
    held = recorded.trials if recorded is not None and "study" in recorded.trials else None
    out = {}
    for key, spec in studies.items():
        rows = [] if held is None else held[held["study"] == spec.name].to_dict("records")
        use = rule_of_row(rows[0]) if rows else rule
        if rows and epoch_budget_given and use.epoch_budget != rule.epoch_budget:
            raise UserError(f"--epoch-budget {rule.epoch_budget}: the results bundle's study {spec.name} was tuned "
                            f"under {use.text}, and resumes under it. Leave --epoch-budget out (or give "
                            f"{use.epoch_budget}) to resume, or use a new --out for another budget.")
        out[key] = dataclasses.replace(spec, rule=use)
    groups: dict[tuple[str, str], dict[TuningRule, list[str]]] = {}
    for (dataset, _, draw), spec in out.items():
        groups.setdefault((dataset, draw), {}).setdefault(spec.rule, []).append(spec.name)
    for (dataset, draw), rules in groups.items():
        if len(rules) > 1:
            told = "; ".join(f"{', '.join(names)}: {r.text}" for r, names in rules.items())
            raise UserError(f"{dataset} draw {draw}: its studies would be tuned under different rules ({told}), so "
                            "their choices would not rest on equal budgets. The bundle's studies were tuned before "
                            "2026-12-06: resume them with the command that started them, and run new methods or "
                            "draws in a new --out.")
    return out


def check_epoch_budget(rule: TuningRule, budget: int, epochs: int) -> None:
    """An epoch budget that takes effect: every start point can finish (else halving's guard is void), and the
    trials cannot all finish within it (else it caps nothing)."""
    least, most = tuning.start_count(budget) * epochs, budget * epochs
    if rule.epoch_budget is not None and not least <= rule.epoch_budget < most:
        raise UserError(f"--epoch-budget {rule.epoch_budget}: with --budget {budget} trials of {epochs} epochs it must "
                        f"be at least {least} (the {tuning.start_count(budget)} start points' epochs) and below "
                        f"{most} (every trial's: it would cap nothing).")


def check_seeds(args, final_seeds, tuned: tuple[str, ...]) -> None:
    """Refuse, before anything runs, seeds a campaign's draws would share or that exceed the largest seed: the
    final seeds of every draw (``final_seeds(args, draw)``), the tuning seeds of every draw, and the two sets."""
    draws = range(1, (args.draws if args.protocol in tuned else 1) + 1)
    finals = sorted({s for d in draws for s in final_seeds(args, d)})
    for seed in finals:  # refused now, not by every one of the training runs
        check_seed(seed, "--seeds" if seed in args.seeds else f"--seeds shifted for draw {args.draws} (draw d runs "
                   "--seeds + (d - 1) x their span; give smaller --seeds or fewer --draws)")
    draws = [set(fair_tuning.draw_seeds(args.tuning_seeds, d)) for d in range(1, args.draws + 1)]
    every_tuning_seed = set().union(*draws)
    if args.protocol in tuned and sum(map(len, draws)) != len(every_tuning_seed):
        raise UserError(f"--tuning-seeds {' '.join(map(str, args.tuning_seeds))} with --draws {args.draws}: draw d "
                        f"trains with the tuning seeds + {fair_tuning.DRAW_SEED_STEP} (d - 1), so two draws would "
                        f"share a seed and not be independent. Give tuning seeds less than "
                        f"{fair_tuning.DRAW_SEED_STEP} apart from each other's shifts (e.g. one seed).")
    too_large = sorted(s for s in every_tuning_seed if s > MAX_SEED)
    if args.protocol in tuned and too_large:
        raise UserError(f"--tuning-seeds with --draws {args.draws}: draw seeds up to {too_large[-1]} exceed the "
                        f"largest seed {MAX_SEED}; give smaller --tuning-seeds or fewer --draws.")
    shared = sorted(every_tuning_seed & set(finals))
    if args.protocol in tuned and shared:
        raise UserError(f"--tuning-seeds and --seeds share {' '.join(map(str, shared))} (draw d trains with the "
                        f"tuning seeds + {fair_tuning.DRAW_SEED_STEP} (d - 1)): the chosen setting would be "
                        "evaluated on a seed it was chosen on. Use tuning seeds outside --seeds.")
    if args.protocol in tuned and args.prune and len(args.tuning_seeds) > 1:
        raise UserError(f"--prune with {len(args.tuning_seeds)} --tuning-seeds: successive halving stops a trial on "
                        "one run's epochs, while its value is the mean over seeds. Use one tuning seed, or no --prune.")


MAX_WIDENINGS = 2  # at most this many re-tunings of one method; a choice still at an edge is then reported


def widen(studies: Studies, chosen: pd.DataFrame, widening: int, alike: bool = True) -> Studies:
    """New studies after a choice sat at a widenable edge of a knob's range: the same budget over the range
    extended past that edge (``protocol.widened``); the earlier studies stay recorded.

    A chosen knob in the outer 5 % of its range means the range, not the method, bounded the result, so
    the method is tuned again rather than compared at a setting it was not allowed to leave. ``alike``: every
    method of that data set and draw is tuned again (its own edge knobs widened, the others' ranges kept), so
    that every method's choice comes from one study of the same budget; otherwise (the legacy rule) only the
    method at the edge is, which gave it twice the trials of the others.
    """
    out = {}
    edges = {}
    for row in chosen.itertuples():
        spec = studies[(row.dataset, row.method, str(row.draw))]
        sides = dict(edge.split("=") for edge in str(row.at_edge).split())
        knobs = [(protocol.widened(k, sides[k.key]) or k) if k.key in sides else k for k in spec.knobs]
        edges[(row.dataset, row.method, str(row.draw))] = tuple(knobs)
    widened = {(key[0], key[2]) for key, knobs in edges.items() if knobs != studies[key].knobs}
    for key, knobs in edges.items():
        spec = studies[key]
        if knobs == spec.knobs and not (alike and (key[0], key[2]) in widened):
            continue
        name = dataclasses.replace(spec, widening=widening).name
        out[key] = dataclasses.replace(spec, knobs=tuple(knobs), widening=widening,
                                       folder=spec.folder.parent / name,
                                       overrides=tuple(o if not o.startswith("output_dir=") else
                                                       f"output_dir={spec.folder.parent / name}"
                                                       for o in spec.overrides))
    return out
