"""A campaign's results bundle: the small tables every published number is recomputed from.

A campaign (``mtl_cog.experiments.campaign``: a sweep, a leader curve, a reproduction, its tuning)
writes ``<out>/bundle/`` as its runs finish, small enough to commit (a 40-task run adds ~10 kB):

- ``campaign.json``: ``format``, ``campaign`` (its name: two campaigns never share a bundle),
  ``command``, ``specs`` ({run: {digest, configs, overrides}} of every planned run: what composes it
  again on a fresh clone), ``counterparts``
  ({method: counterpart}, what the paired comparisons pair), ``environment`` (python, torch,
  platform, the code's commit);
- ``runs.csv``: one row per run (``RUN_COLUMNS``): what it was (data, method, role, tuning draw,
  trial, leader/follower ratio, seed, config digest), how it ended (status, reason), what it used
  (images per split, epochs, whether it converged, wall seconds, torch threads per process, versions,
  commit);
- ``results.csv.gz``: ``run, split, task, metric, value`` at the selected checkpoint, task ``mean``
  included; split ``test+ts`` is the test split after a post-hoc calibrator (``ts``) fitted on the
  run's validation predictions;
- ``curves.csv.gz``: ``run, epoch, split, metric, value`` per epoch: the validation task means, the
  training loss, and what the convergence rule reads (``calibrator``/``from_last``: the calibrator's
  largest distance to its final values; ``calibrator``/``scale``: its largest magnitude at epoch 1);
  stage two of TST/V-TST as split ``stage_two``;
- ``trials.csv``: every tuning trial, failed and pruned ones included (``state``, ``reason``,
  parameters, value);
- ``reliability.csv.gz``: per run and task, the test split's reliability histogram (20 bins: count,
  summed confidence, summed outcome; ``mtl_cog.bundles.bundle_reliability``), what ``report --bundle``
  draws reliability diagrams from; absent in bundles written before it (their report says so).

The files are written one at a time, ``runs.csv`` last: a run's rows count only once its
``runs.csv`` row exists, so a bundle interrupted between two files holds no half-recorded run. Then
``campaign.json`` records the seal and ``manifest.json`` seals them (``bundle_manifest``: every file's SHA-256 and
row count; a seal once written cannot be removed and re-applied over an edit), and every read
checks the seal, then every column against one schema (``bundle_schema``), then that ``runs.csv``'s
labels are those ``campaign.json`` planned: an edited number, label or role is refused, naming the file. The
CSV files are written deterministically (sorted rows, gzip without a timestamp, 8 significant
digits), so a bundle re-collected from the same runs is byte-identical and a commit shows what changed.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mtl_cog.bundles import bundle_manifest as manifest
from mtl_cog.bundles.bundle_reliability import (
    RELIABILITY,
    RELIABILITY_COLUMNS,
    RELIABILITY_SORT,
    empty_reliability,
    reliability_problems,
)
from mtl_cog.bundles.bundle_schema import SCHEMAS, validate
from mtl_cog.errors import UserError
from mtl_cog.io import atomic_write_bytes, atomic_write_text

FORMAT = "mtl_cog.results_bundle.v1"
FOLDER = "bundle"
CAMPAIGN, RUNS, RESULTS, CURVES, TRIALS = "campaign.json", "runs.csv", "results.csv.gz", "curves.csv.gz", "trials.csv"
RUN_COLUMNS = ["run", "campaign", "data", "method", "role", "draw", "trial", "ratio", "seed", "config_digest",
               "status", "reason", "train_size", "val_size", "test_size", "epochs_run", "converged", "wall_s",
               "threads", "versions", "commit"]
RESULT_COLUMNS = ["run", "split", "task", "metric", "value"]
CURVE_COLUMNS = ["run", "epoch", "split", "metric", "value"]
FLOAT_FORMAT = "%.8g"
# trials.csv columns of whole numbers: read back as floats wherever a cell is empty (retry_of is, on most rows), so
# they are written as integers, or a rewrite that changes nothing would turn a committed "5" into "5.0"
TRIAL_WHOLE_NUMBERS = ("trial", "retry_of", "epochs_trained")


@dataclass
class Bundle:
    campaign: dict
    runs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RUN_COLUMNS))
    results: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RESULT_COLUMNS))
    curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CURVE_COLUMNS))
    trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    reliability: pd.DataFrame = field(default_factory=empty_reliability)

    @property
    def name(self) -> str:
        return str(self.campaign.get("campaign", ""))

    def done(self) -> pd.DataFrame:
        """The runs.csv rows of runs that finished (status ``done``)."""
        return self.runs[self.runs["status"] == "done"]

    def add_run(self, row: dict, results: pd.DataFrame, curves: pd.DataFrame,
                reliability: pd.DataFrame | None = None) -> None:
        """Record one run (replacing its earlier rows, e.g. a failure now finished; ``reliability``: its histogram
        rows, none when not given)."""
        missing = [c for c in RUN_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"a runs.csv row lacks {missing}")
        name = row["run"]
        self.runs = pd.concat([self.runs[self.runs["run"] != name], pd.DataFrame([row], columns=RUN_COLUMNS)],
                              ignore_index=True)
        self.results = pd.concat([self.results[self.results["run"] != name], results[RESULT_COLUMNS]],
                                 ignore_index=True)
        self.curves = pd.concat([self.curves[self.curves["run"] != name], curves[CURVE_COLUMNS]], ignore_index=True)
        kept = self.reliability[self.reliability["run"] != name]
        self.reliability = kept if reliability is None or reliability.empty else pd.concat(
            [kept, reliability.assign(run=name)[RELIABILITY_COLUMNS]], ignore_index=True)

    def set_trials(self, study: str, table: pd.DataFrame) -> None:
        """Replace the trials of ``study`` (a ``study`` column is added) by ``table``."""
        kept = self.trials[self.trials["study"] != study] if "study" in self.trials else self.trials
        self.trials = pd.concat([kept, table.assign(study=study)], ignore_index=True)


def bundle_dir(out: Path) -> Path:
    return Path(out) / FOLDER


def _csv_bytes(frame: pd.DataFrame, sort: list[str], gz: bool) -> bytes:
    frame = frame.sort_values(sort, kind="stable") if len(frame) else frame
    text = frame.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    if not gz:
        return text.encode()
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as handle:  # mtime 0: reproducible
        handle.write(text.encode())
    return buffer.getvalue()


def write_bundle(folder: Path, bundle: Bundle) -> None:
    """Write every file of ``bundle`` into ``folder`` (created), ``runs.csv`` last, then seal it (``manifest.json``:
    the caller holds the campaign's collection lock)."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest.unseal(folder)
    # no record of a seal while the tables change: a writer killed midway leaves an unsealed bundle, never a
    # recorded seal its files contradict (which every read would refuse)
    campaign = {k: v for k, v in bundle.campaign.items() if k != manifest.SEAL_KEY}
    atomic_write_text(folder / CAMPAIGN, _campaign_text(campaign))
    results = bundle.results.astype({"value": float})  # object columns (after a concat) ignore float_format
    curves = bundle.curves.astype({"value": float, "epoch": int})
    atomic_write_bytes(folder / RESULTS, _csv_bytes(results, ["run", "split", "task", "metric"], gz=True))
    atomic_write_bytes(folder / CURVES, _csv_bytes(curves, ["run", "split", "metric", "epoch"], gz=True))
    if len(bundle.reliability):  # a bundle without histograms (an old one) gets no file: its bytes stay the same
        atomic_write_bytes(folder / RELIABILITY, _csv_bytes(bundle.reliability, RELIABILITY_SORT, gz=True))
    if len(bundle.trials):
        atomic_write_bytes(folder / TRIALS, _csv_bytes(_whole_numbers(bundle.trials, TRIAL_WHOLE_NUMBERS),
                                                       ["study", "trial"], gz=False))
    atomic_write_bytes(folder / RUNS, _csv_bytes(bundle.runs, ["run"], gz=False))
    _seal(folder, campaign, {RUNS: len(bundle.runs), RESULTS: len(results), CURVES: len(curves),
                             **({TRIALS: len(bundle.trials)} if len(bundle.trials) else {}),
                             **({RELIABILITY: len(bundle.reliability)} if len(bundle.reliability) else {})})
    bundle.campaign = json.loads((folder / CAMPAIGN).read_text())


def _campaign_text(campaign: dict) -> str:
    return json.dumps(campaign, indent=1, sort_keys=True) + "\n"


def _seal(folder: Path, campaign: dict, rows: dict[str, int]) -> None:
    """Record the seal of the tables in campaign.json, then write the manifest of every file."""
    record = manifest.seal_record(manifest.entries(folder, rows, manifest.table_names(folder)))
    if campaign.get(manifest.SEAL_KEY) != record:
        atomic_write_text(folder / CAMPAIGN, _campaign_text({**campaign, manifest.SEAL_KEY: record}))
    manifest.write_manifest(folder, rows)


def seal_bundle(folder: Path) -> bool:
    """Seal a bundle without a manifest, after every check a read makes -> whether it had none (a sealed one is
    verified and left as it is). A bundle whose campaign.json records its seal gets that manifest back (its files are
    the sealed ones, or the read refused them); an older one is sealed only where git shows it never sealed and holds
    every file as it is (``bundle_manifest.check_never_sealed``). Its tables are not rewritten: the seal vouches for
    exactly the bytes that were committed (campaign.json gains the record of the seal)."""
    folder = Path(folder)
    bundle = read_bundle(folder)
    if bundle is None:
        raise UserError(f"{folder}: no results bundle there (no {CAMPAIGN}).")
    if (folder / manifest.MANIFEST).exists():
        return False
    if manifest.SEAL_KEY not in bundle.campaign:
        manifest.check_never_sealed(folder)
    _seal(folder, bundle.campaign, _table_rows(folder))
    return True


def _table_rows(folder: Path) -> dict[str, int]:
    return {name: len(_read_csv(folder / name, None, manifest.UNSEALED_MAX_ROWS, dtype=str))
            for name in manifest.bundle_files(folder) if name in SCHEMAS}


def _whole_numbers(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` with ``columns`` (those it has) as nullable integers; a value that is not whole raises."""
    present = [c for c in columns if c in frame]
    return frame.assign(**{c: pd.to_numeric(frame[c].replace("", pd.NA)).astype("Int64") for c in present})


def _read_csv(path: Path, columns: list[str] | None, bound: int, **kwargs) -> pd.DataFrame:
    """``path`` as a table of at most ``bound`` rows (the sealed count, or the unsealed limit): more is refused
    before it is all read (a file inflated to gigabytes of well-formed rows)."""
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""], nrows=bound + 1, **kwargs)
    except (OSError, ValueError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise UserError(f"{path}: not a readable results-bundle table ({type(err).__name__}: {err}). Restore it "
                        "from git (git checkout -- <file>), or delete the bundle folder to collect it anew from "
                        "the run folders.") from None
    if len(frame) > bound:
        raise UserError(f"{path}: more than {bound} rows, " + ("the count its bundle's manifest.json sealed" if
                        bound != manifest.UNSEALED_MAX_ROWS else "the most an unsealed bundle's file may hold")
                        + ". Restore it from git, or delete the bundle folder to collect it anew.")
    if columns is not None and list(frame.columns) != columns:
        raise UserError(f"{path}: columns {list(frame.columns)} are not the bundle format's {columns}. Restore it "
                        "from git, or delete the bundle folder to collect it anew from the run folders.")
    return frame


def _read_table(folder: Path, name: str, columns: list[str] | None, bounds: dict[str, int] | None,
                **kwargs) -> pd.DataFrame:
    """One bundle table: its text checked against the schema and the seal's row count, then read typed."""
    path = folder / name
    bound = manifest.UNSEALED_MAX_ROWS if bounds is None else bounds.get(name, manifest.UNSEALED_MAX_ROWS)
    text = _read_csv(path, None, bound, dtype=str).fillna("")
    validate(path, text, SCHEMAS[name])
    if bounds is not None and name in bounds and len(text) != bounds[name]:
        raise UserError(f"{path}: {len(text)} rows, and the bundle's manifest.json sealed {bounds[name]}. Restore it "
                        "from git.")
    return text if kwargs.get("dtype") is str else _read_csv(path, columns, bound, **kwargs)


def read_bundle(folder: Path) -> Bundle | None:
    """The bundle in ``folder``; None when there is none (no ``campaign.json``); one error line when damaged."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, where a campaign keeps its results bundle (a folder). Move it away, "
                        "or use another --out.")
    if not (folder / CAMPAIGN).is_file() or (folder / CAMPAIGN).is_symlink():
        manifest.bundle_files(folder) if folder.is_dir() else None  # a campaign.json that is a link or a folder
        if folder.is_dir() and any(folder.iterdir()):
            raise UserError(f"{folder}: holds files but no {CAMPAIGN}, so it is no results bundle (or a damaged "
                            "one). Restore it from git, or move it away.")
        return None
    try:
        campaign = json.loads((folder / CAMPAIGN).read_text())
        if not isinstance(campaign, dict) or campaign.get("format") != FORMAT:
            raise ValueError(f"format {campaign.get('format') if isinstance(campaign, dict) else None!r}, "
                             f"expected {FORMAT!r}")
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{folder / CAMPAIGN}: not a results bundle's campaign record ({err}). Restore it from "
                        "git, or delete the bundle folder to collect it anew.") from None
    bounds = manifest.verify(folder, campaign)  # before any table is parsed: a refused file is never read
    if not (folder / RUNS).exists():
        if bounds is None:
            manifest.check_unsealed(folder, campaign, _table_rows(folder))
        return Bundle(campaign)
    # every runs.csv column as text: a hex digest such as 1234e567... would otherwise be read as a float
    runs = _read_table(folder, RUNS, RUN_COLUMNS, bounds, dtype=str)
    results = _read_table(folder, RESULTS, RESULT_COLUMNS, bounds, dtype={"run": str, "task": str})
    curves = _read_table(folder, CURVES, CURVE_COLUMNS, bounds, dtype={"run": str})
    trials = _read_table(folder, TRIALS, None, bounds) if (folder / TRIALS).exists() else pd.DataFrame()
    reliability = _read_table(folder, RELIABILITY, RELIABILITY_COLUMNS, bounds, dtype=str) \
        if (folder / RELIABILITY).exists() else empty_reliability()
    known = set(runs["run"])  # rows of a run whose runs.csv row was never written do not count
    bundle = Bundle(campaign, runs, results[results["run"].isin(known)].reset_index(drop=True),
                    curves[curves["run"].isin(known)].reset_index(drop=True), trials,
                    reliability[reliability["run"].isin(known)].reset_index(drop=True))
    check_bundle(folder, bundle)
    if bounds is None:  # judged once its tables passed the schema: a damaged file is named as such first
        manifest.check_unsealed(folder, campaign, _table_rows(folder))
    return bundle


def check_bundle(folder: Path, bundle: Bundle) -> None:
    """Refuse a bundle whose rows contradict each other (edited by hand, two campaigns merged)."""
    runs = bundle.runs
    problems = []
    for key in ("specs", "counterparts"):
        if not isinstance(bundle.campaign.get(key, {}), dict):
            problems.append(f"{CAMPAIGN}'s {key!r} is not a mapping")
    if problems:  # the checks below read them
        raise UserError(f"{folder}: inconsistent results bundle: {'; '.join(problems)}. Restore it from git.")
    if set(runs["campaign"]) - {bundle.name}:
        problems.append(f"rows of another campaign ({', '.join(sorted(set(runs['campaign']) - {bundle.name}))}) "
                        f"in a bundle of {bundle.name!r}")
    specs = {run: record["digest"] if isinstance(record, dict) else record  # a digest alone in older bundles
             for run, record in bundle.campaign.get("specs", {}).items()}
    other = [r for r, d in zip(runs["run"], runs["config_digest"]) if r in specs and specs[r] != d]
    if other:
        problems.append(f"config digests in {RUNS} differ from {CAMPAIGN}'s for {', '.join(other[:3])}")
    problems += _label_problems(bundle)
    problems += _finished_run_problems(bundle) + reliability_problems(bundle.reliability)
    if problems:
        raise UserError(f"{folder}: inconsistent results bundle: {'; '.join(problems)}. Restore it from git, or "
                        "delete the bundle folder to collect it anew from the run folders.")


def _label(key: str, value) -> str:
    """A label as runs.csv and campaign.json both write it: a ratio as its number, the rest as text."""
    if key == "ratio" and value not in ("", None):
        try:
            return f"{float(value):.6g}"
        except (TypeError, ValueError):
            return str(value)
    return "" if value is None else str(value)


def _label_problems(bundle: Bundle) -> list[str]:
    """runs.csv's labels must be those campaign.json planned the run with (a run relabelled cog_ts -> baseline,
    synthetic -> celeba would be reported under its new label with its real numbers)."""
    specs = bundle.campaign.get("specs", {})
    for row in bundle.runs.to_dict("records"):
        planned = specs.get(row["run"], {}).get("labels") if isinstance(specs.get(row["run"]), dict) else None
        if not isinstance(planned, dict):
            continue  # an older bundle records a digest alone
        differ = [k for k, v in planned.items() if k in row and _label(k, v) != _label(k, row[k])]
        if differ:
            key = differ[0]
            return [f"run {row['run']}'s {key} in {RUNS} is {row[key]!r}, and {CAMPAIGN} planned it as "
                    f"{planned[key]!r}"]
    return []


def _finished_run_problems(bundle: Bundle) -> list[str]:
    """What a finished run's rows must hold for its numbers to be shown: test results, every one finite (a
    diverged run fails, it does not finish), and the final runs of one method and draw one setting between them."""
    done = bundle.done()
    results = bundle.results[bundle.results["run"].isin(set(done["run"]))]
    problems = []
    tested = set(results.loc[results["split"] == "test", "run"])
    untested = [r for r in done["run"] if r not in tested]
    if untested:
        problems.append(f"finished run(s) without test results in {RESULTS}: {', '.join(untested[:3])}")
    values = pd.to_numeric(results["value"], errors="coerce")
    bad = results[values.isna() | (values.abs() == float("inf"))]
    if len(bad):
        first = bad.iloc[0]
        problems.append(f"{len(bad)} value(s) of finished runs in {RESULTS} are not finite (first: run "
                        f"{first['run']}, {first['split']} {first['metric']} of task {first['task']})")
    specs = bundle.campaign.get("specs", {})
    finals = done[done["role"] == "final"]
    for (data, method, draw), group in finals.groupby(["data", "method", finals["draw"].fillna("").astype(str)]):
        settings = {specs[r]["setting"] for r in group["run"] if isinstance(specs.get(r), dict)
                    and specs[r].get("setting")}
        if len(settings) > 1:
            problems.append(f"the final runs of {data}/{method}" + (f" (draw {draw})" if draw else "")
                            + f" were trained with {len(settings)} different settings ({CAMPAIGN}'s specs): "
                            "their mean would pool them")
    return problems


def wide_scores(bundle: Bundle, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (run, split, task) with a column per metric and the run's labels, finished runs only.

    A post-hoc split ``test+<name>`` becomes split ``test`` of method ``<method>+<name>`` (the
    reports' name for a calibrator fitted after training, e.g. ``baseline+ts``).
    """
    runs = bundle.done() if runs is None else runs
    if bundle.results.empty or runs.empty:
        return pd.DataFrame(columns=["run", "split", "task", "data", "method", "role", "draw", "trial", "ratio",
                                     "seed"])
    scored = bundle.results[bundle.results["run"].isin(set(runs["run"])) & (bundle.results["split"] != "calibrator")]
    wide = scored.pivot_table(
        index=["run", "split", "task"], columns="metric", values="value", aggfunc="first").reset_index()
    wide.columns.name = None
    labels = runs[["run", "data", "method", "role", "draw", "trial", "ratio", "seed"]]
    wide = wide.merge(labels, on="run", how="left")
    posthoc = wide["split"].str.startswith("test+")
    wide.loc[posthoc, "method"] = wide.loc[posthoc, "method"] + "+" + wide.loc[posthoc, "split"].str[5:]
    wide.loc[posthoc, "split"] = "test"
    wide["ratio"] = pd.to_numeric(wide["ratio"], errors="coerce")
    wide["seed"] = wide["seed"].astype(int)
    return wide
