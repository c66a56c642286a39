"""One results bundle's raw files (runs.csv, results.csv.gz, campaign.json, reliability.csv.gz), read with pandas
alone, and the quantities the page prints recomputed from them: paired differences, TS's gain, the regime gate."""

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from claims_audit.rule import (
    CLAIMS,
    DRAWS,
    GAP,
    GATE_CHANGE,
    GATE_ECE,
    GATE_SEEDS,
    IDENTITY,
    LIVE_SHARE,
    MIN_LIVE_SHARE,
    RULES,
    Draw,
    answer,
    reading,
    summarise,
    t_interval,
)


class AuditError(Exception):
    """Bad input (a missing page or bundle file, a page without markers): one ``error:`` line, exit 2."""


def read_bundle_file(path: Path, reader):
    try:
        return reader(path)
    except FileNotFoundError:
        raise AuditError(f"bundle file not found: {path}") from None
    except (OSError, ValueError) as err:  # unreadable, or not the format it should be
        raise AuditError(f"cannot read {path}: {err}") from None


def verify_manifest(path: Path) -> None:
    """Every file the bundle's ``manifest.json`` seals has the SHA-256 sealed there, as the project's loader demands
    before it reads a table: a damaged or hand-edited file is refused, never audited. An unsealed bundle (no
    manifest) is read as it is, as the project reads it."""
    if not (path / "manifest.json").is_file():
        return
    manifest = read_bundle_file(path / "manifest.json", lambda p: json.loads(p.read_text(encoding="utf-8")))
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise AuditError(f"{path / 'manifest.json'}: not a bundle's seal (a mapping whose 'files' maps each file to "
                         "its sha256); restore the committed bundle (git checkout) before auditing")
    for name, entry in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise AuditError(f"{path / 'manifest.json'}: names {name!r}, not a file of the bundle's own folder")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise AuditError(f"{path / 'manifest.json'}: the entry of {name} has no sha256 text; restore the "
                             "committed bundle (git checkout) before auditing")
        digest = read_bundle_file(path / name, lambda p: hashlib.sha256(p.read_bytes()).hexdigest())
        if digest != entry["sha256"]:
            raise AuditError(f"{path / name}: not the file manifest.json sealed (its SHA-256 differs); restore the "
                             "committed bundle (git checkout) before auditing")


LABELS = ("data", "method", "role", "draw", "trial", "ratio", "seed")


def labelled_specs(specs: dict, runs: pd.DataFrame) -> dict:
    """campaign.json's specs, each with its ``labels`` and ``overrides``: a spec recorded before campaign.json kept
    labels (a digest, its configs) takes them from its runs.csv row, as the project's loader does; one without a row
    names no run this audit could place, and is left out."""
    rows = {row["run"]: row for row in runs.to_dict("records")} if "run" in runs else {}
    out = {}
    for run, spec in specs.items():
        spec = spec if isinstance(spec, dict) else {"digest": spec}
        labels = spec.get("labels")
        if not isinstance(labels, dict):
            if run not in rows:
                continue
            labels = {k: ("" if pd.isna(rows[run].get(k)) else rows[run].get(k)) for k in LABELS}
        out[run] = {**spec, "labels": labels, "overrides": list(spec.get("overrides", []))}
    return out


def draw_alone(command: list) -> tuple[int, int] | None:
    """(K, N) where the recorded command ran ``--only-draw K`` of ``--draws N`` (N > 1): one draw of a design of
    several, which the rule gives a per-draw reading, not an answer; None otherwise. Read as argparse reads it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--draws", type=int)
    parser.add_argument("--only-draw", type=int)
    try:
        known, _ = parser.parse_known_args([str(c) for c in command])
    except SystemExit:  # a value that is not a whole number: the project's reproduce would have refused it
        return None
    return (known.only_draw, known.draws) if known.only_draw and known.draws and known.draws > 1 else None


class Bundle:
    """One results bundle's raw files, read once."""

    def __init__(self, path: Path):
        verify_manifest(path)
        runs = read_bundle_file(path / "runs.csv", pd.read_csv)
        results = read_bundle_file(path / "results.csv.gz", pd.read_csv)
        values = pd.to_numeric(results["value"], errors="coerce")
        if not np.isfinite(values).all():  # the project's own loader refuses such a bundle: so does this audit
            raise AuditError(f"{path / 'results.csv.gz'}: {int((~np.isfinite(values)).sum())} value(s) not finite")
        campaign = read_bundle_file(path / "campaign.json", lambda p: json.loads(p.read_text()))
        if not isinstance(campaign, dict) or not isinstance(campaign.get("specs", {}), dict):
            raise AuditError(f"{path / 'campaign.json'}: not a campaign record (a mapping with a 'specs' mapping)")
        self.specs = labelled_specs(campaign.get("specs", {}), runs)
        self.counterparts = campaign.get("counterparts", {})
        self.one_draw = draw_alone(campaign.get("command") or [])
        curves = read_bundle_file(path / "curves.csv.gz", pd.read_csv) if (path / "curves.csv.gz").is_file() else \
            pd.DataFrame(columns=["run", "epoch", "split", "metric", "value"])  # no rates recorded: none judged
        rates = curves[(curves["split"] == "train") & (curves["metric"] == "lr")].sort_values(["run", "epoch"])
        rates = rates.assign(value=pd.to_numeric(rates["value"], errors="coerce"))
        # per run, the share of its epochs before the rate first fell below 1/10 of the highest rate so far
        live = rates["value"] >= LIVE_SHARE * rates.groupby("run")["value"].cummax() * (1 - 1e-9)
        self.live_share = live.groupby(rates["run"]).agg(lambda s: (s.cumprod().sum()) / len(s))
        bins = path / "reliability.csv.gz"  # a sweep's bundle keeps none
        self.reliability = read_bundle_file(bins, pd.read_csv) if bins.is_file() else None
        runs["draw"] = pd.to_numeric(runs["draw"], errors="coerce")
        self.done = runs[runs["status"] == "done"]
        self.finals = self.done[self.done["role"] == "final"]
        self.curves = self.done[self.done["role"] == "curve"].assign(ratio=lambda r: pd.to_numeric(r["ratio"]))
        tasks = results[results["task"] != "mean"]
        # the task mean from the task rows themselves, not the bundle's own 'mean' row (unweighted, as the page says)
        # a NaN task value, or a task row missing, leaves the mean undefined rather than a mean of fewer tasks
        grouped = tasks[tasks["split"] != "calibrator"].groupby(["run", "split", "metric"])["value"]
        self.n_tasks = tasks["task"].nunique()
        self.means = grouped.mean().where(grouped.count() == self.n_tasks)
        test_accuracy = tasks[(tasks["split"] == "test") & (tasks["metric"] == "accuracy")]
        self.accuracy = test_accuracy.set_index(["run", "task"])["value"]
        self.temperatures = tasks[(tasks["split"] == "calibrator") & (tasks["metric"] == "temperature")]
        self.planned: dict[tuple[str, int], set[int]] = {}
        for labels in (spec["labels"] for spec in self.specs.values() if spec["labels"]["role"] == "final"):
            self.planned.setdefault((labels["method"], int(labels["draw"])), set()).add(int(labels["seed"]))
        self.data = {spec["labels"]["data"] for spec in self.specs.values()}
        self.computed: dict[tuple[str, str, str], pd.Series] = {}

    def values(self, method: str, metric: str, base: str = "test") -> pd.Series:
        """Task-mean ``metric`` of a final method per (draw, seed); ``baseline+X``: the baseline's ``base+X``.
        Kept once computed: a bundle never changes once read, and a page asks for the same values hundreds of times
        (callers only read the series)."""
        if (method, metric, base) not in self.computed:
            self.computed[(method, metric, base)] = self._values(method, metric, base)
        return self.computed[(method, metric, base)]

    def _values(self, method: str, metric: str, base: str) -> pd.Series:
        runs = self.finals[self.finals["method"] == method.partition("+")[0]]
        index = pd.MultiIndex.from_arrays([runs["draw"].astype(int), runs["seed"].astype(int)], names=["draw", "seed"])
        return pd.Series(self.task_means(runs["run"], method, metric, base), index=index).dropna()

    def task_means(self, runs: pd.Series, method: str, metric: str, base: str = "test") -> np.ndarray:
        """Each run's task-mean ``metric`` on split ``base`` (``method`` ``baseline+X``: split ``base+X``)."""
        calibrator = method.partition("+")[2]
        split = f"{base}+{calibrator}" if calibrator else base
        keys = pd.MultiIndex.from_arrays([runs, [split] * len(runs), [metric] * len(runs)])
        return self.means.reindex(keys).to_numpy()

    def untested(self, draw: int) -> bool:
        """Whether COG-TS's learned temperature is within 1 % of identity on every task of every final run of a draw."""
        runs = self.finals[(self.finals["method"] == "cog_ts") & (self.finals["draw"] == draw)]["run"]
        found = self.temperatures[self.temperatures["run"].isin(runs)]["value"]
        return bool(len(found)) and bool(((found - 1).abs() < IDENTITY).all())

    def annealed(self, variant: str, draw: int) -> bool:
        """Whether every final run of a COG variant in a draw held its rate live for under half its epochs."""
        runs = self.finals[(self.finals["method"] == variant) & (self.finals["draw"] == draw)]["run"]
        shares = self.live_share.reindex(runs)
        known = bool(len(runs)) and shares.notna().all()
        return variant.startswith("cog") and known and bool((shares < MIN_LIVE_SHARE).all())

    def pair(self, variant: str, counterpart: str, metric: str, draw: int, side: int, base: str = "test",
             against: "Bundle | None" = None) -> Draw:
        """One draw's paired difference variant − counterpart over the seeds both sides finished, and its reading;
        the counterpart's runs from ``against`` where given (the asymmetry: another protocol's bundle)."""
        against = against or self
        diffs = (self.values(variant, metric, base) - against.values(counterpart, metric, base)).dropna()
        diffs = diffs[diffs.index.get_level_values("draw") == draw]
        planned = self.planned.get((variant.partition("+")[0], draw), set())
        planned = planned & against.planned.get((counterpart.partition("+")[0], draw), set())
        mean, low, high, half = t_interval(diffs)
        untested = variant == "cog_ts" and self.untested(draw)
        return Draw(len(diffs), len(planned), mean, low, high, half, reading(low, high, side, len(diffs)), untested,
                    self.annealed(variant, draw))


def planned_draws(bundle: Bundle, against: Bundle | None = None) -> list[int]:
    """The draws a claim is read over: those the bundle (and ``against``) planned final runs in, as the generator
    reads them (a campaign of one draw, ``reproduce --only-draw``, is complete without the other); both draws where
    nothing records a plan."""
    draws = {d for _, d in bundle.planned} | ({d for _, d in against.planned} if against is not None else set())
    return sorted(draws) or list(DRAWS)


def claim(bundle: Bundle, text: str, metric: str, against: Bundle | None = None, scored: bool | None = None
          ) -> tuple[dict[int, Draw], float, float, str]:
    """A claim on one metric: its draws, the page's difference (mean of the draws' means), the widest draw's
    half-width and the answer; the counterpart's runs from ``against`` where given. ``scored``: whether the table
    holds any finished final run (default: ``bundle`` does)."""
    _, variant, counterpart, side = CLAIMS[text]
    side = -side if metric == "accuracy" else side  # a higher accuracy is the better one
    draws = {d: bundle.pair(variant, counterpart, metric, d, side, against=against)
             for d in planned_draws(bundle, against)}
    alone = bundle.one_draw or (against.one_draw if against is not None else None)
    return draws, *summarise(draws), answer(draws, bool(len(bundle.finals)) if scored is None else scored, alone)


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


