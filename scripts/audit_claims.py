#!/usr/bin/env python
"""audit_claims: check that a claims page's numbers and readings follow from its committed results bundles.

    python scripts/audit_claims.py docs/results/overconfident.md [--root DIR]

Why a second implementation: ``regenerate_docs_tables.py --check`` proves only that the page equals what mtl_cog
computes from the bundles, so a bug in mtl_cog's reporting would pass it. This script never imports mtl_cog
(standard library, numpy, pandas, scipy only): it re-derives the numbers and readings from the bundles' raw files
(runs.csv, results.csv.gz, campaign.json, reliability.csv.gz) with its own reading of the plan's decision rule.
Audited, on the page and its ``<stem>_appendix.md`` if any: the ``bundle-protocols`` blocks ``claims``, ``power``
and ``secondary``, and the ``bundle-table: <bundle> claims`` and ``regime_gate`` blocks, with the bundle paths their
markers name, relative to ``--root`` (default: the page's git root, else the current directory).

The rule as read here: a final run's task-mean metric (recomputed from the task rows) on its ``test`` split, the
selected checkpoint (``baseline+ts``: the baseline run's ``test+ts`` split). Per tuning draw, the paired per-seed
difference variant − counterpart gets a 95 % t interval: *supported* when it excludes 0 on the claimed side,
*contradicted* on the other, *inconclusive at this scale* otherwise. The answer is *incomplete* while a draw lacks
planned seeds; else *not tested at this budget* for COG-TS where, in some draw, its learned temperature stayed
within 1 % of identity on every task of every final run (the variant did nothing to test); else the draws' common
reading or *depends on the tuning draw*. A printed number matches within half a unit of its last printed digit.
Exit status: 0 when all match; 1 on a mismatch (each listed with both values); 2 on bad input (one ``error:`` line).
"""

import argparse
import json
import re
import subprocess
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

# The page's claim wording -> (id, variant, counterpart, claimed sign of variant − counterpart on NLL and ECE@15).
CLAIMS = {
    "COG-FC improves on the baseline": ("H1", "cog_fc", "baseline", -1),
    "COG+LS improves on label smoothing": ("H2", "cog_ls", "ls", -1),
    "COG-TS is worse than post-hoc TS": ("H3", "cog_ts", "baseline+ts", +1),
    "unregularised post-hoc MS worsens the baseline": ("H4", "baseline+ms", "baseline", +1),
}
CLAIM_OF_ID = {ident: text for text, (ident, *_) in CLAIMS.items()}
GAINS = ("H1", "H2")  # the claimed gains: the only claims a surviving share is a share of
DRAWS = (1, 2)
IDENTITY = 0.01  # a learned temperature within 1 % of 1 leaves the predictions as they were
GATE_ECE, GATE_CHANGE, GATE_SEEDS = 0.03, -0.05, 3  # the regime gate's thresholds and fewest seeds
RULES = {"best validation Brier": "", "last epoch": "@last"}  # checkpoint rule -> its results splits' suffix
SECONDARY_BASE = {"last epoch": "test@last", "Guo's TS recipe": "test"}
GAP = "confidence − accuracy"
MARKER = re.compile(r"<!-- (bundle-(?:protocols|table): [^>]*?) -->\n(.*?)<!-- /bundle-", re.S)
# a per-draw claims cell: 'reading (difference [low, high])', wrapped in 'not tested at this budget (...)' where
# COG-TS's temperature stayed at identity, then '(draw d: n of p seeds)' while the draw is short of seeds
CELL = re.compile(r"^(?:(not tested at this budget) \()?(supported|contradicted|inconclusive at this scale|"
                  r"no interval \(one seed\)) \(([+-][0-9.]+)(?: \[([+-][0-9.]+), ([+-][0-9.]+)\])?\)\)?"
                  r"(?: \(draw \d+: (\d+) of (\d+) seeds\))?$")
# a secondary reading's draw: '1: variant (5 seeds)', '2: counterpart (4 of 5 seeds, incomplete)'
SECONDARY_DRAW = re.compile(r"(\d+): (variant|counterpart|inconclusive|no interval \(one seed\)|not run yet)"
                            r"(?: \((\d+)(?: of (\d+))? seeds)?")


class AuditError(Exception):
    """Bad input (a missing page or bundle file, a page without markers): one ``error:`` line, exit 2."""


class Draw(NamedTuple):
    n: int  # seeds with both sides finished
    planned: int
    mean: float
    low: float
    high: float
    half: float
    reading: str
    untested: bool  # COG-TS's temperature stayed at identity in this draw


def t_interval(x) -> tuple[float, float, float, float]:
    """Mean and 95 % t interval (low, high, half-width) over seeds; no interval below two seeds."""
    x = np.asarray(x, float)
    mean = float(x.mean()) if len(x) else np.nan
    if len(x) < 2:
        return mean, np.nan, np.nan, np.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half, half


def read_bundle_file(path: Path, reader):
    try:
        return reader(path)
    except FileNotFoundError:
        raise AuditError(f"bundle file not found: {path}") from None
    except (OSError, ValueError) as err:  # unreadable, or not the format it should be
        raise AuditError(f"cannot read {path}: {err}") from None


class Bundle:
    """One results bundle's raw files, read once."""

    def __init__(self, path: Path):
        runs = read_bundle_file(path / "runs.csv", pd.read_csv)
        results = read_bundle_file(path / "results.csv.gz", pd.read_csv)
        self.specs = read_bundle_file(path / "campaign.json", lambda p: json.loads(p.read_text())).get("specs", {})
        bins = path / "reliability.csv.gz"  # a sweep's bundle keeps none
        self.reliability = read_bundle_file(bins, pd.read_csv) if bins.is_file() else None
        runs["draw"] = pd.to_numeric(runs["draw"], errors="coerce")
        self.done = runs[runs["status"] == "done"]
        self.finals = self.done[self.done["role"] == "final"]
        tasks = results[results["task"] != "mean"]
        # the task mean from the task rows themselves, not the bundle's own 'mean' row (unweighted, as the page says)
        self.means = tasks[tasks["split"] != "calibrator"].groupby(["run", "split", "metric"])["value"].mean()
        test_accuracy = tasks[(tasks["split"] == "test") & (tasks["metric"] == "accuracy")]
        self.accuracy = test_accuracy.set_index(["run", "task"])["value"]
        self.temperatures = tasks[(tasks["split"] == "calibrator") & (tasks["metric"] == "temperature")]
        self.planned: dict[tuple[str, int], set[int]] = {}
        for labels in (spec["labels"] for spec in self.specs.values() if spec["labels"]["role"] == "final"):
            self.planned.setdefault((labels["method"], int(labels["draw"])), set()).add(int(labels["seed"]))
        self.data = {spec["labels"]["data"] for spec in self.specs.values()}

    def values(self, method: str, metric: str, base: str = "test") -> pd.Series:
        """Task-mean ``metric`` of a final method per (draw, seed); ``baseline+X``: the baseline's ``base+X``."""
        run_method, _, calibrator = method.partition("+")
        split = f"{base}+{calibrator}" if calibrator else base
        runs = self.finals[self.finals["method"] == run_method]
        keys = pd.MultiIndex.from_arrays([runs["run"], [split] * len(runs), [metric] * len(runs)])
        index = pd.MultiIndex.from_arrays([runs["draw"].astype(int), runs["seed"].astype(int)], names=["draw", "seed"])
        return pd.Series(self.means.reindex(keys).to_numpy(), index=index).dropna()

    def untested(self, draw: int) -> bool:
        """Whether COG-TS's learned temperature is within 1 % of identity on every task of every final run of a draw."""
        runs = self.finals[(self.finals["method"] == "cog_ts") & (self.finals["draw"] == draw)]["run"]
        found = self.temperatures[self.temperatures["run"].isin(runs)]["value"]
        return bool(len(found)) and bool(((found - 1).abs() < IDENTITY).all())

    def pair(self, variant: str, counterpart: str, metric: str, draw: int, side: int, base: str = "test") -> Draw:
        """One draw's paired difference variant − counterpart over the seeds both sides finished, and its reading."""
        diffs = (self.values(variant, metric, base) - self.values(counterpart, metric, base)).dropna()
        diffs = diffs[diffs.index.get_level_values("draw") == draw]
        planned = self.planned.get((variant.partition("+")[0], draw), set())
        planned = planned & self.planned.get((counterpart.partition("+")[0], draw), set())
        mean, low, high, half = t_interval(diffs)
        untested = variant == "cog_ts" and self.untested(draw)
        return Draw(len(diffs), len(planned), mean, low, high, half, reading(low, high, side, len(diffs)), untested)


def reading(low: float, high: float, side: int, n: int) -> str:
    """A draw's reading: its interval turned to the claimed side (``side``) lies above 0, below 0, or holds it."""
    if n < 2:
        return "" if n == 0 else "no interval (one seed)"
    low, high = sorted((side * low, side * high))
    return "supported" if low > 0 else "contradicted" if high < 0 else "inconclusive at this scale"


def claim(bundle: Bundle, text: str, metric: str) -> tuple[dict[int, Draw], float, float, str]:
    """A claim on one metric: its draws, the page's difference (mean of the draws' means), the widest draw's
    half-width and the answer."""
    _, variant, counterpart, side = CLAIMS[text]
    side = -side if metric == "accuracy" else side  # a higher accuracy is the better one
    draws = {d: bundle.pair(variant, counterpart, metric, d, side) for d in DRAWS}
    return draws, *summarise(draws), answer(draws)


def summarise(draws: dict[int, Draw]) -> tuple[float, float]:
    """The mean of the draws' mean differences and the widest draw's half-width (draws that ran)."""
    ran = [r for r in draws.values() if r.n]
    halves = [r.half for r in ran if np.isfinite(r.half)]
    return float(np.mean([r.mean for r in ran])) if ran else np.nan, max(halves) if halves else np.nan


def answer(draws: dict[int, Draw]) -> str:
    gaps = [f"draw {d} missing" if r.n == 0 else f"draw {d}: {r.n} of {r.planned} seeds"
            for d, r in draws.items() if r.n == 0 or r.n < r.planned]
    if gaps:
        return f"incomplete ({', '.join(gaps)})"
    if any(r.untested for r in draws.values()):
        return "not tested at this budget"
    readings = {r.reading for r in draws.values()}
    return readings.pop() if len(readings) == 1 else "depends on the tuning draw"


def ts_gain(bundle: Bundle, metric: str) -> float:
    """Post-hoc TS's gain on the final baseline: mean over seeds of baseline − baseline+ts, then over draws."""
    gain = (bundle.values("baseline", metric) - bundle.values("baseline+ts", metric)).dropna()
    return float(gain.groupby(level="draw").mean().mean()) if len(gain) else np.nan


def confidence_gap(bundle: Bundle, runs: list[str]) -> float:
    """Mean top-label confidence minus accuracy (task mean, then run mean) from the test split's reliability bins.

    A binary task's 20 bins hold p(positive) and count positives (a prediction below 0.5 is the negative class, of
    confidence 1 − p, right where the label is 0); a multi-class task's hold the top-label confidence and count
    correct predictions. The bins do not say which, so each row takes the reading whose accuracy is the closer to
    the run's recorded test accuracy of that task (both readings agree where no prediction is below 0.5)."""
    rel, gaps = bundle.reliability, {}
    if rel is None:
        return np.nan
    for run, task, *bins in rel[(rel["split"] == "test") & rel["run"].isin(runs)][
            ["run", "task", "count", "confidence_sum", "outcome_sum"]].itertuples(index=False):
        count, confidence, outcome = (np.array(str(b).split(), float) for b in bins)
        n, low, high = count.sum(), slice(0, len(count) // 2), slice(len(count) // 2, None)
        multi_class = (confidence.sum(), outcome.sum())
        binary = (confidence[high].sum() + (count[low] - confidence[low]).sum(),
                  outcome[high].sum() + (count[low] - outcome[low]).sum())
        accuracy = bundle.accuracy.get((run, task), np.nan)
        conf, right = min((multi_class, binary), key=lambda r: abs(r[1] / n - accuracy))
        gaps.setdefault(run, []).append((conf - right) / n)
    return float(np.mean([np.mean(g) for g in gaps.values()])) if set(gaps) == set(runs) else np.nan


def gate(bundle: Bundle, runs: list[str], planned: int, rule: str) -> dict:
    """The regime gate of one setting's runs under one checkpoint rule (the page's columns)."""
    tag = RULES[rule]
    columns = {"val_nll": (f"val{tag}", "nll"), "test_ece@15": (f"test{tag}", "ece@15"),
               "test_nll": (f"test{tag}", "nll"), "test_nll+ts": (f"test{tag}+ts", "nll")}
    table = pd.DataFrame({name: bundle.means.reindex([(r, *key) for r in runs]).to_numpy()
                          for name, key in columns.items()}, index=runs).dropna()
    row = {"seeds": f"{len(table)} of {planned}", "passes": "", GAP: np.nan}
    change = table["test_nll+ts"] / table["test_nll"] - 1  # per seed, relative change of the task-mean NLL
    row.update(table.mean().to_dict())
    row["ts_nll_change"], row["ci_low"], row["ci_high"], _ = t_interval(change)
    if len(table) and len(table) >= max(planned, GATE_SEEDS):  # read on every planned seed or not at all
        row["passes"] = str(bool(row["test_ece@15"] >= GATE_ECE and row["ts_nll_change"] <= GATE_CHANGE
                                 and row["ci_high"] < 0))
    if not tag and len(table):  # the bins are the selected checkpoint's only
        row[GAP] = confidence_gap(bundle, list(table.index))
    return row


class Audit:
    """The comparisons made and the mismatches found."""

    def __init__(self, root: Path):
        self.root, self.bundles, self.mismatches = root, {}, []
        self.numbers = self.readings = 0

    def bundle(self, rel: str) -> Bundle:
        if rel not in self.bundles:
            try:
                self.bundles[rel] = Bundle(self.root / rel)
            except KeyError as err:
                raise AuditError(f"{self.root / rel}: a bundle file lacks {err}") from None
        return self.bundles[rel]

    def number(self, what: str, cell: str, ours: float) -> None:
        """A printed number matches ours within half a unit of its last printed digit (0.0043: ± 0.00005, float
        slack aside); a blank cell stands for no value."""
        self.numbers += 1
        cell = str(cell).strip()
        try:
            tolerance = 0.5 * 10.0 ** Decimal(cell).as_tuple().exponent + 1e-12 if cell else None
            ok = abs(float(cell) - ours) <= tolerance if cell else not np.isfinite(ours)
        except (InvalidOperation, TypeError, ValueError):  # not a number where the page should print one
            ok = False
        if not ok:
            self.mismatches.append(f"{what}: page {cell or '(blank)'}, bundles {ours:.6g}")

    def text(self, what: str, cell: str, ours: str) -> None:
        self.readings += 1
        if str(cell).strip() != ours:
            self.mismatches.append(f"{what}: page {cell or '(blank)'!r}, bundles {ours or '(blank)'!r}")


def tables(path: Path) -> list[tuple[str, list[dict]]]:
    """Each generated block's marker (without ``<!-- -->``) and its Markdown table's rows."""
    blocks = []
    for match in MARKER.finditer(path.read_text()):
        lines = [line for line in match.group(2).splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")] if lines else []
        rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
        blocks.append((match.group(1), rows))
    return blocks


def protocol_bundles(audit: Audit, head: str) -> dict[tuple[str, str], Bundle]:
    """``(protocol, data set) -> bundle`` from a ``bundle-protocols`` marker's ``paper=a,b fair=c,d``."""
    found = {}
    for protocol, paths in re.findall(r"(\w+)=([^\s=]+)", head.split(" where ")[0]):
        for rel in paths.split(","):
            bundle = audit.bundle(rel)
            found.update({(protocol, data): bundle for data in bundle.data})
    return found


def audit_claims(audit: Audit, where: str, bundles: dict, rows: list[dict]) -> None:
    protocols = sorted({p for p, _ in bundles})
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        summary = {p: claim(bundles[(p, row["data"])], row["claim"], row["metric"]) for p in protocols}
        for p, (_, difference, half, ans) in summary.items():
            audit.text(f"{label}: {p}", row[p], ans)
            audit.number(f"{label}: {p} difference", row[f"{p} difference"], difference)
            audit.number(f"{label}: {p} ± (95 %)", row[f"{p} ± (95 %)"], half)
        if "surviving share" in row and {"paper", "fair"} <= set(summary):
            # fair over paper, where the paper protocol supports a claimed gain and the fair answer is complete
            (_, paper, _, paper_ans), (_, fair, _, fair_ans) = summary["paper"], summary["fair"]
            shared = CLAIMS[row["claim"]][0] in GAINS and paper_ans == "supported" and paper != 0
            share = fair / paper if shared and not fair_ans.startswith("incomplete") else np.nan
            audit.number(f"{label}: surviving share", row["surviving share"], share)


def audit_per_draw(audit: Audit, where: str, bundle: Bundle, rows: list[dict]) -> None:
    """A bundle's claims per draw (``CELL``) and their answer."""
    for row in rows:
        label = f"{where}: {row['data']}, {row['claim']}, {row['metric']}"
        draws, _, _, ans = claim(bundle, row["claim"], row["metric"])
        for d, r in draws.items():
            cell, name = row[f"draw {d}"], f"{label}: draw {d}"
            match = CELL.match(cell)
            if not match:
                audit.text(name, cell, "" if r.n == 0 else "a reading with its difference")
                continue
            untested, word, mean, low, high, n, planned = match.groups()
            audit.text(f"{name} reading", word, r.reading)
            audit.text(f"{name} not tested", str(untested is not None), str(r.untested))
            audit.number(f"{name} difference", mean, r.mean)
            audit.number(f"{name} low", low or "", r.low)
            audit.number(f"{name} high", high or "", r.high)
            ours = "all" if r.n >= r.planned else f"{r.n} of {r.planned}"
            audit.text(f"{name} seeds", f"{n} of {planned}" if n else "all", ours)
        audit.text(f"{label}: answer", row["answer"], ans)


def audit_power(audit: Audit, where: str, bundles: dict, rows: list[dict]) -> None:
    """TS's gain on the final baseline; a claim could detect a gain that size when its widest half-width is below."""
    for row in rows:
        label = f"{where}: {row['protocol']}, {row['data']}, {row['metric']}"
        bundle = bundles[(row["protocol"], row["data"])]
        gain = ts_gain(bundle, row["metric"])
        audit.number(f"{label}: ts gain", row["ts gain"], gain)
        could, so_far = [], False
        for ident in ("H1", "H2", "H3"):
            _, _, half, ans = claim(bundle, CLAIM_OF_ID[ident], row["metric"])
            audit.number(f"{label}: {ident} ± (95 %)", row[f"{ident} ± (95 %)"], half)
            could += [ident] if np.isfinite(half) and half < gain else []
            so_far |= ans.startswith("incomplete")
        cell = row["could detect"]
        audit.text(f"{label}: could detect", cell.split(",")[0].strip(), " ".join(could) or "none")
        audit.text(f"{label}: so far", str("so far" in cell), str(so_far))


def audit_secondary(audit: Audit, where: str, bundles: dict, rows: list[dict]) -> None:
    """The plan's secondary readings: per draw, which side the interval favours (the lower metric is the better)."""
    for row in rows:
        label = f"{where}: {row['protocol']}, {row['reading']}, {row['data']}, {row['pair']}, {row['metric']}"
        bundle, base = bundles[(row["protocol"], row["data"])], SECONDARY_BASE[row["reading"]]
        variant, counterpart = row["pair"].split(" − ")
        draws = {d: bundle.pair(variant, counterpart, row["metric"], d, -1, base) for d in DRAWS}
        difference, half = summarise(draws)
        audit.number(f"{label}: difference", row["difference"], difference)
        audit.number(f"{label}: ± (95 %)", row["± (95 %)"], half)
        found = {int(m.group(1)): m.group(0) for m in SECONDARY_DRAW.finditer(row["per draw"])}
        for d, r in draws.items():
            side = {"supported": "variant", "contradicted": "counterpart"}.get(r.reading, r.reading.split(" at ")[0])
            seeds = f"{r.n} seeds" if r.n == r.planned else f"{r.n} of {r.planned} seeds"
            ours = f"{d}: not run yet" if r.n == 0 else f"{d}: {side} ({seeds}"
            audit.text(f"{label}: draw {d}", found.get(d, ""), ours)


def audit_gate(audit: Audit, where: str, bundle: Bundle, rows: list[dict]) -> None:
    """The regime gate: a pilot's rows are sweep settings ('optim.follower_lr=3e-4'), a campaign's its final
    baseline per draw ('fashion_mnist, baseline, draw 1 (optim.follower_lr=…)')."""
    tuned_at = {}
    for row in rows:
        label = f"{where}: {row['setting']}, {row['rule']}"
        final = re.match(r"(\w+), baseline, draw (\d+)(?: \((.*)\))?$", row["setting"])
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
        if "tuned" in row and row["rule"] == "best validation Brier":
            tuned_at[row["setting"]] = (ours.get("val_nll", np.nan), ours["seeds"])
    # the tuning's choice: the lowest validation NLL at the selected checkpoint, once every setting finished
    complete = all(a == b for _, seeds in tuned_at.values() for a, b in [seeds.split(" of ")])
    best = min(tuned_at, key=lambda s: tuned_at[s][0]) if complete and tuned_at else None
    for row in (row for row in rows if "tuned" in row):
        audit.text(f"{where}: {row['setting']}, {row['rule']}: tuned", row["tuned"], "*" * (row["setting"] == best))


PROTOCOL_BLOCKS = {"claims": audit_claims, "power": audit_power, "secondary": audit_secondary}
TABLE_BLOCKS = {"claims": audit_per_draw, "regime_gate": audit_gate}


def audit_page(audit: Audit, path: Path) -> int:
    """Audit every block this script knows on one page; the number of blocks audited."""
    audited = 0
    for head, rows in tables(path):
        kind, _, rest = head.partition(": ")
        name, table = (rest.split() + [""])[:2]
        if kind == "bundle-protocols" and name in PROTOCOL_BLOCKS:
            where, handler, source = f"{path.name} {name}", PROTOCOL_BLOCKS[name], protocol_bundles(audit, rest)
        elif kind == "bundle-table" and table in TABLE_BLOCKS:
            where, handler, source = f"{path.name} {name} {table}", TABLE_BLOCKS[table], audit.bundle(name)
        else:
            continue
        try:
            handler(audit, where, source, rows)
        except (KeyError, ValueError) as err:  # a column, claim, rule or data set this audit does not know
            audit.text(f"{where}: table", f"unrecognised {err}", "the layout this audit reads (rest unaudited)")
        audited += 1
    return audited


def repository_root(page: Path) -> Path:
    """The page's git root, else the current directory."""
    try:
        return Path(subprocess.run(["git", "-C", str(page.parent), "rev-parse", "--show-toplevel"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return Path.cwd()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the claims page, e.g. docs/results/overconfident.md")
    parser.add_argument("--root", type=Path, help="the directory the markers' bundle paths are relative to "
                        "(default: the page's git root, else the current directory)")
    args = parser.parse_args(argv)
    try:
        if not args.page.is_file():
            raise AuditError(f"page not found: {args.page}")
        audit = Audit(args.root or repository_root(args.page.resolve()))
        pages = [args.page] + [p for p in [args.page.with_name(f"{args.page.stem}_appendix.md")] if p.is_file()]
        if not sum(audit_page(audit, page) for page in pages):
            raise AuditError(f"{args.page} has no bundle-protocols or bundle-table markers this script audits")
    except AuditError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = f"{len(audit.mismatches)} mismatch(es):\n  " + "\n  ".join(audit.mismatches)
    print(f"audited {audit.numbers} numbers and {audit.readings} readings in {args.page}: "
          f"{found if audit.mismatches else 'all match'}")
    return 1 if audit.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
