"""One check per generated block kind: each re-derives the block's rows from the bundles and hands every cell to
the ``Audit`` ledger. ``audit_page`` dispatches a page's blocks by their marker."""

import re
from pathlib import Path

import numpy as np

from claims_audit.bundle import Bundle, claim, gate, planned_draws, ts_gain
from claims_audit.curve import audit_curve, audit_curve_paired
from claims_audit.page import CELL, SECONDARY_SEGMENT, Audit, kept, keys, protocol_bundles, split_top, tables
from claims_audit.rule import (
    ALL_METRICS,
    CLAIM_OF_ID,
    CLAIMS,
    DRAWS,
    GAP,
    PRIMARY,
    RULES,
    SECONDARY_BASE,
    SECONDARY_PAIRS,
    answer,
    summarise,
    supported_power,
    surviving_share,
)

CLAIM_KEY = ("data", "claim", "metric")  # what names a row of a claims or asymmetry table
# a campaign's regime-gate row: 'fashion_mnist, baseline, draw 1 (optim.follower_lr=…)'
FINAL_SETTING = re.compile(r"(\w+), baseline, draw (\d+)(?: \((.*)\))?$")
ASYMMETRY_CLAIMS = ("H1", "H3")  # the COG studies the two protocols share (H2's COG+LS and H4's MS have no pairing)


def audit_claims(audit: Audit, where: str, bundles: dict, rows: list[dict], header: list[str], head: str) -> None:
    protocols = sorted({p for p, _ in bundles})
    both = {"paper", "fair"} <= set(protocols)
    known = {"data", "claim", "metric", *(f"{p}{c}" for p in protocols for c in ("", " difference", " ± (95 %)"))}
    known |= {"surviving share"} if both else set()
    audit.columns(where, header, known, known)
    audit.coverage(where, keys(rows, CLAIM_KEY),
                   kept(head, CLAIM_KEY, [(d, c, m) for _, d in bundles for c in CLAIMS for m in ALL_METRICS]))
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        summary = {p: claim(bundles[(p, row["data"])], row["claim"], row["metric"]) for p in protocols}
        for p, (_, difference, half, ans) in summary.items():
            audit.text(f"{label}: {p}", row[p], ans)
            audit.number(f"{label}: {p} difference", row[f"{p} difference"], difference)
            audit.number(f"{label}: {p} ± (95 %)", row[f"{p} ± (95 %)"], half)
        if "surviving share" in row and {"paper", "fair"} <= set(summary):
            (_, paper, _, paper_ans), (_, fair, _, fair_ans) = summary["paper"], summary["fair"]
            audit.number(f"{label}: surviving share", row["surviving share"],
                         surviving_share(row["claim"], paper_ans, paper, fair_ans, fair))


def audit_asymmetry(audit: Audit, where: str, bundles: dict, rows: list[dict], header: list[str], head: str) -> None:
    """The paper's tuning asymmetry: the fair bundle's tuned COG-FC / COG-TS finals against the paper bundle's
    untuned baseline finals (and TS fitted on them), paired by draw and seed; the fair answer and difference (against
    the tuned baseline) beside it, and the share of a supported gain the fair protocol keeps."""
    known = {"data", "claim", "metric", "answer", "difference", "± (95 %)", "fair", "fair difference",
             "surviving share"}
    audit.columns(where, header, known, known)
    both = {d for p, d in bundles if p == "paper"} & {d for p, d in bundles if p == "fair"}
    # the paired table holds the paper bundle's baseline finals and the fair bundle's COG-FC / COG-TS finals: it
    # has rows (some perhaps incomplete) as soon as either side has finished one
    variants = {CLAIMS[CLAIM_OF_ID[ident]][1] for ident in ASYMMETRY_CLAIMS}
    scored = {d: bool((bundles[("paper", d)].finals["method"] == "baseline").sum()
                      + bundles[("fair", d)].finals["method"].isin(variants).sum()) for d in both}
    audit.coverage(where, keys(rows, CLAIM_KEY), kept(head, CLAIM_KEY, [
        (d, CLAIM_OF_ID[ident], m) for d in both if scored[d] for ident in ASYMMETRY_CLAIMS for m in ALL_METRICS]))
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        fair, paper = bundles[("fair", row["data"])], bundles[("paper", row["data"])]
        ans, difference, fair_ans, fair_difference = _against_fair(
            audit, label, row, claim(fair, row["claim"], row["metric"], against=paper, scored=scored[row["data"]]),
            fair)
        audit.number(f"{label}: surviving share", row["surviving share"],
                     surviving_share(row["claim"], ans, difference, fair_ans, fair_difference))


CONTROL_CLAIMS = ("H1", "H2")  # the pinned campaign's COG-FC and COG+LS against the fair campaign's counterparts


def audit_controls(audit: Audit, where: str, bundles: dict, rows: list[dict], header: list[str], head: str) -> None:
    """The hierarchy isolated: the pinned bundle's COG-FC / COG+LS finals against the fair bundle's baseline / LS
    finals, paired by draw and seed; the fair protocol's own answer and difference beside it."""
    known = {"data", "claim", "metric", "answer", "difference", "± (95 %)", "fair", "fair difference"}
    audit.columns(where, header, known, known)
    both = {d for p, d in bundles if p == "pinned"} & {d for p, d in bundles if p == "fair"}
    ran = {d: {m for m, _ in bundles[("pinned", d)].planned} for d in both}
    audit.coverage(where, keys(rows, CLAIM_KEY), kept(head, CLAIM_KEY, [
        (d, CLAIM_OF_ID[i], m) for d in both for i in CONTROL_CLAIMS if CLAIMS[CLAIM_OF_ID[i]][1] in ran[d]
        for m in ALL_METRICS]))
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        pinned, fair = bundles[("pinned", row["data"])], bundles[("fair", row["data"])]
        _against_fair(audit, label, row, claim(pinned, row["claim"], row["metric"], against=fair), fair)


def _against_fair(audit: Audit, label: str, row: dict, mixed: tuple, fair: Bundle) -> tuple[str, float, str, float]:
    """Check a row of one campaign's variant against another's counterpart (``mixed``: ``claim(..., against=)``)
    and the fair bundle's own reading beside it; returns (answer, difference, fair answer, fair difference)."""
    _, difference, half, ans = mixed
    _, fair_difference, _, fair_ans = claim(fair, row["claim"], row["metric"])
    audit.text(f"{label}: answer", row["answer"], ans)
    audit.number(f"{label}: difference", row["difference"], difference)
    audit.number(f"{label}: ± (95 %)", row["± (95 %)"], half)
    audit.text(f"{label}: fair", row["fair"], fair_ans)
    audit.number(f"{label}: fair difference", row["fair difference"], fair_difference)
    return ans, difference, fair_ans, fair_difference


def audit_per_draw(audit: Audit, where: str, bundle: Bundle, rows: list[dict], header: list[str], head: str) -> None:
    """A bundle's claims per draw (``CELL``) and their answer."""
    # one column per draw the bundle planned final runs in (a campaign of one draw, ``--only-draw``, has one)
    known = {"data", "claim", "pair", "metric", "answer", *(f"draw {d}" for d in planned_draws(bundle))}
    audit.columns(where, header, known, known)
    audit.coverage(where, keys(rows, CLAIM_KEY), kept(head, CLAIM_KEY, [
        (d, c, m) for d in bundle.data if len(bundle.finals) for c in CLAIMS for m in ALL_METRICS]))
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        _, variant, counterpart, _ = CLAIMS[row["claim"]]
        audit.text(f"{label}: pair", row["pair"], f"{variant} − {counterpart}")
        draws, _, _, ans = claim(bundle, row["claim"], row["metric"])
        for d, r in draws.items():
            cell, name = row[f"draw {d}"], f"{label}: draw {d}"
            match = CELL.match(cell)
            if not match:
                audit.text(name, cell, "" if r.n == 0 else "a reading with its difference")
                continue
            annealed, untested, word, mean, low, high, n, planned = match.groups()
            named = re.search(r"\(draw (\d+): \d+ of \d+ seeds\)$", cell)
            audit.text(f"{name} draw named", named.group(1) if named else str(d), str(d))
            audit.text(f"{name} reading", word, r.reading)
            audit.text(f"{name} not tested", str(untested is not None), str(r.untested))
            audit.text(f"{name} schedule", str(annealed is not None), str(r.annealed))
            audit.number(f"{name} difference", mean, r.mean)
            audit.number(f"{name} low", low or "", r.low)
            audit.number(f"{name} high", high or "", r.high)
            ours = "all" if r.n >= r.planned else f"{r.n} of {r.planned}"
            audit.text(f"{name} seeds", f"{n} of {planned}" if n else "all", ours)
        audit.text(f"{label}: answer", row["answer"], ans)


POWER_SLACK = 0.015  # the page simulates (20,000 draws: one s.e. <= 0.0035); this audit computes it exactly


def audit_power(audit: Audit, where: str, bundles: dict, rows: list[dict], header: list[str], head: str) -> None:
    """TS's gain on the final baseline; each claim's probability that the rule reads supported for a gain that size,
    computed exactly here (the noncentral t of each draw's interval) against the page's simulation."""
    known = {"protocol", "data", "metric", "ts gain", "power note", "H1 P(supported)", "H2 P(supported)",
             "H3 P(supported)"}
    audit.columns(where, header, known, known)
    key = ("protocol", "data", "metric")
    audit.coverage(where, keys(rows, key),
                   kept(head, key, [(p, d, m) for (p, d), b in bundles.items() if len(b.finals) for m in PRIMARY]))
    for row in rows:
        label = f"{where}: {row['protocol']}, {row['data']}, {row['metric']}"
        bundle = bundles[(row["protocol"], row["data"])]
        gain = ts_gain(bundle, row["metric"])
        audit.number(f"{label}: ts gain", row["ts gain"], gain)
        so_far = False
        for ident in ("H1", "H2", "H3"):
            draws, _, _, ans = claim(bundle, CLAIM_OF_ID[ident], row["metric"])
            audit.number(f"{label}: {ident} P(supported)", row[f"{ident} P(supported)"],
                         supported_power(gain, [r for r in draws.values() if r.n]), slack=POWER_SLACK)
            so_far |= ans.startswith("incomplete")
        # the whole cell: the claims, then what is still missing (claims, or baseline runs TS's gain is read on)
        gain_draws = {d: bundle.pair("baseline+ts", "baseline", row["metric"], d, 1) for d in DRAWS}
        gaps = answer(gain_draws)
        note = [f"ts gain {gaps}"] if gaps.startswith("incomplete") else []
        audit.text(f"{label}: power note", row["power note"], "; ".join(["claims incomplete"] * so_far + note))


def audit_secondary(audit: Audit, where: str, bundles: dict, rows: list[dict], header: list[str], head: str) -> None:
    """The plan's secondary readings: per draw, which side the interval favours (the lower metric is the better)."""
    known = {"protocol", "reading", "data", "pair", "metric", "difference", "± (95 %)", "per draw"}
    audit.columns(where, header, known, known)
    key = ("protocol", "reading", "data", "pair", "metric")
    audit.coverage(where, keys(rows, key), kept(head, key, [
        (p, reading, d, pair, m) for (p, d), b in bundles.items() if len(b.finals)
        for reading, pairs in SECONDARY_PAIRS.items() for pair in pairs for m in PRIMARY]))
    for row in rows:
        label = f"{where}: {row['protocol']}, {row['reading']}, {row['data']}, {row['pair']}, {row['metric']}"
        bundle, base = bundles[(row["protocol"], row["data"])], SECONDARY_BASE[row["reading"]]
        variant, counterpart = row["pair"].split(" − ")
        draws = {d: bundle.pair(variant, counterpart, row["metric"], d, -1, base) for d in DRAWS}
        difference, half = summarise(draws)
        audit.number(f"{label}: difference", row["difference"], difference)
        audit.number(f"{label}: ± (95 %)", row["± (95 %)"], half)
        segments = split_top(row["per draw"])
        found = [m.group(1) or m.group(2) if m else s for s in segments for m in [SECONDARY_SEGMENT.match(s)]]
        ours = []
        for d, r in draws.items():
            side = {"supported": "variant", "contradicted": "counterpart"}.get(r.reading, r.reading.split(" at ")[0])
            seeds = f"{r.n} seeds" if r.n == r.planned else f"{r.n} of {r.planned} seeds, incomplete"
            ours.append(f"{d}: not run yet" if r.n == 0 else f"{d}: {side} ({seeds}")
        audit.text(f"{label}: per draw", " | ".join(found), " | ".join(ours))


def sweep_settings(bundle: Bundle) -> set[frozenset]:
    """A pilot's settings: the overrides that differ between its sweep specs, seeds aside."""
    sweeps = [set(s["overrides"]) for s in bundle.specs.values() if s["labels"]["role"] == "sweep"]
    common = set.intersection(*sweeps) if sweeps else set()
    return {frozenset(o for o in s - common if not o.startswith("seed=")) for s in sweeps}


def audit_gate(audit: Audit, where: str, bundle: Bundle, rows: list[dict], header: list[str], head: str) -> None:
    """The regime gate: a pilot's rows are sweep settings ('optim.follower_lr=3e-4'), a campaign's its final
    baseline per draw ('fashion_mnist, baseline, draw 1 (optim.follower_lr=…)')."""
    campaign = bool(bundle.planned)
    known = {"setting", "rule", "seeds", "val_nll", "test_ece@15", "test_nll", "test_nll+ts", "ts_nll_change",
             "ci_low", "ci_high", "passes", "note"}
    # a campaign's table has the confidence gap (blank without reliability bins); a pilot's marks the tuned rate
    extra = {GAP} if campaign else {"tuned"}
    needed = extra if not campaign or bundle.reliability is not None else set()
    audit.columns(where, header, known | extra, known - {"note"} | needed)
    if campaign:
        keys = [(m.group(1), int(m.group(2)), r.get("rule")) if m else (r.get("setting"), r.get("rule"))
                for r in rows for m in [FINAL_SETTING.match(r.get("setting", ""))]]
        expected = {(d, draw, rule) for d in bundle.data for (method, draw) in bundle.planned if method == "baseline"
                    for rule in RULES} if len(bundle.finals) else set()
    else:
        keys = [(frozenset(r.get("setting", "").split(", ")), r.get("rule")) for r in rows]
        expected = {(s, rule) for s in sweep_settings(bundle) for rule in RULES}
    audit.coverage(where, keys, expected)
    tuned_at = {}
    for row in rows:
        label = f"{where}: {row['setting']}, {row['rule']}"
        final = FINAL_SETTING.match(row["setting"])
        if final:
            data, draw, rate = final.group(1), int(final.group(2)), final.group(3) or ""
            f = bundle.finals
            done = f[(f["method"] == "baseline") & (f["draw"] == draw) & (f["data"] == data)]
            runs, planned = list(done["run"]), len(bundle.planned.get(("baseline", draw), ()))
            rates = {o for r in runs for o in bundle.specs[r]["overrides"] if o.startswith("optim.follower_lr=")}
            audit.text(f"{label}: rate", rate, ", ".join(sorted(rates)))
        else:  # a sweep setting: the specs carrying each of its overrides
            specs = {k for k, s in bundle.specs.items()
                     if s["labels"]["role"] == "sweep" and set(row["setting"].split(", ")) <= set(s["overrides"])}
            runs, planned = [r for r in bundle.done["run"] if r in specs], len(specs)
        ours = gate(bundle, runs, planned, row["rule"])
        audit.text(f"{label}: seeds", row["seeds"], ours["seeds"])
        for column in ("val_nll", "test_ece@15", "test_nll", "test_nll+ts", "ts_nll_change", "ci_low", "ci_high"):
            audit.number(f"{label}: {column}", row[column], ours.get(column, np.nan))
        if GAP in row:
            audit.number(f"{label}: {GAP}", row[GAP], ours[GAP])
        audit.text(f"{label}: passes", row["passes"], ours["passes"])
        if "note" in row:  # a draw read on fewer seeds than planned says so
            n, planned_seeds = ours["seeds"].split(" of ")
            ours_note = f"incomplete: read once all {planned_seeds} seeds are in" if int(n) < int(planned_seeds) else ""
            audit.text(f"{label}: note", row["note"], ours_note)
        if "tuned" in row and row["rule"] == "best validation Brier":
            tuned_at[row["setting"]] = (ours.get("val_nll", np.nan), ours["seeds"])
    # the tuning's choice: the lowest validation NLL at the selected checkpoint, once every setting finished
    complete = all(a == b for _, seeds in tuned_at.values() for a, b in [seeds.split(" of ")])
    best = min(tuned_at, key=lambda s: tuned_at[s][0]) if complete and tuned_at else None
    for row in (row for row in rows if "tuned" in row):
        audit.text(f"{where}: {row['setting']}, {row['rule']}: tuned", row["tuned"], "*" * (row["setting"] == best))


PROTOCOL_BLOCKS = {"claims": audit_claims, "power": audit_power, "secondary": audit_secondary,
                   "asymmetry": audit_asymmetry, "controls": audit_controls}
TABLE_BLOCKS = {"claims": audit_per_draw, "regime_gate": audit_gate, "curve": audit_curve,
                "curve_paired": audit_curve_paired}
# the generator's other tables: named in the output as not audited; a kind outside both lists is a mismatch
UNAUDITED = {"progress", "summary", "summary_values", "paired", "verdicts", "chosen", "draw_choices", "convergence",
             "convergence_runs", "scope", "calibrators", "sweep_settings", "sweep_paired"}


def audit_page(audit: Audit, path: Path) -> int:
    """Audit every block this script knows on one page; the number of blocks audited."""
    audited = 0
    for head, header, rows in tables(path):
        audit.cells += [cell for row in rows for cell in row.values()]
        if header is None:
            audit.text(f"{path.name}: marker {head!r}", "unreadable (no newline after it)", "a block")
            continue
        kind, _, rest = head.partition(": ")
        name, table = (rest.split() + [""])[:2]
        if kind == "bundle-protocols" and name in PROTOCOL_BLOCKS:
            where, handler, source = f"{path.name} {name}", PROTOCOL_BLOCKS[name], protocol_bundles(audit, rest)
        elif kind == "bundle-table" and table in TABLE_BLOCKS:
            where, handler, source = f"{path.name} {name} {table}", TABLE_BLOCKS[table], audit.bundle(name)
            if source is None:  # the lane has not committed a run: the generator names it, no table
                audit.text(f"{where}: rows of a bundle not written yet", "present" if rows else "none", "none")
                audit.skipped.append("not written yet")
                audited += 1
                continue
        elif kind == "bundle-figure":  # an SVG drawn from the curve table (the same --check compares its bytes)
            audit.skipped.append("figure")
            continue
        else:
            if (table if kind == "bundle-table" else name) not in UNAUDITED:
                audit.text(f"{path.name}: block {head!r}", "a kind no check reads", "a kind the generator writes")
            audit.skipped.append(table if kind == "bundle-table" else name)
            continue
        try:
            handler(audit, where, source, rows, header, head)
        except (KeyError, ValueError, TypeError, SyntaxError) as err:  # a column, claim, rule or data set unknown here
            audit.text(f"{where}: table", f"unrecognised {err}", "the layout this audit reads (rest unaudited)")
        audited += 1
    return audited


