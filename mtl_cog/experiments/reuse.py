"""What a resumed campaign reuses, checked first: a recorded run against its folder, the thread count it ran on.

A campaign resumed over its bundle (``campaign.plan``) trains nothing the bundle records as done, and
then chooses, pools and reports from the bundle's numbers. So:

- **a recorded run whose folder is still there must agree with it**: its files against the digests it
  recorded (``runs.digests``), and every row the bundle reuses, recomputed from the folder as a campaign collects
  it (``bundle_rows.run_rows``), against the bundle's (to the 8 significant digits a bundle keeps): every split of
  ``results.csv.gz`` (validation, test, the last epoch's, after each post-hoc calibrator, the learned calibrator's
  values), ``curves.csv.gz`` and ``reliability.csv.gz``. An edited validation NLL made a resumed sweep choose
  another run, an edited temperature or curve value was kept; now each is refused, naming the run, the row and both
  values, as is a row either side lacks.
- **the options that change numbers are the campaign's own**: the torch thread count (a float sum is
  ordered by it, so a resume on another count gives other numbers) is recorded in ``campaign.json``
  (``threads``); a resume without ``--threads`` reuses it (``recorded_threads``), and one whose thread count
  contradicts it is refused (``with_threads``). Precision and every other setting of a run are in its
  config digest already (``campaign.config_digest``), which a resume compares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.bundles import bundle as bundles
from mtl_cog.bundles.bundle_reliability import BIN_VALUES, RELIABILITY
from mtl_cog.bundles.bundle_rows import run_rows
from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.experiments import preregistration
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import covered_files, verify_digests

THREADS = "threads"  # campaign.json's key: torch threads per CPU run (absent: torch's default, GPU runs)
RELATIVE = 1e-6  # a bundle keeps 8 significant digits


def check_run_folder(bundle: bundles.Bundle, run: str, run_dir: Path) -> None:
    """Refuse to reuse ``run`` as the bundle records it when its finished folder (if still there) disagrees."""
    if not (run_dir / rundir.DONE).is_file():
        return  # no folder (a fresh clone of the bundle) or an unfinished one: the bundle is all there is
    recorded = bundle.results[bundle.results["run"] == run]
    try:
        verify_digests(run_dir, covered_files())
        _, results, curves, reliability = run_rows(run_dir, {"run": run}, posthoc_of(recorded["split"]))
    except (RunFolderError, UserError) as err:
        raise UserError(f"run {run} is recorded as finished in the bundle, and its folder cannot be checked "
                        f"against it: {err}") from None
    where = (run, run_dir)
    _compare(where, bundles.RESULTS, results, recorded, ["split", "task", "metric"], numeric=True)
    _compare(where, bundles.CURVES, curves.astype({"epoch": int}),
             bundle.curves[bundle.curves["run"] == run].astype({"epoch": int}), ["split", "metric", "epoch"], True)
    if not bundle.reliability.empty:  # a bundle from before reliability.csv.gz reuses none
        _compare(where, RELIABILITY, reliability, bundle.reliability[bundle.reliability["run"] == run],
                 ["split", "task"], numeric=False)


def posthoc_of(splits) -> tuple[str, ...]:
    """The post-hoc calibrators a run's recorded splits were fitted with (``test+ts``, ``test@last+ts``: ``ts``)."""
    return tuple(sorted({s.partition("+")[2] for s in map(str, splits) if "+" in s}))


def _compare(where: tuple[str, Path], file: str, fresh: pd.DataFrame, recorded: pd.DataFrame, keys: list[str],
             numeric: bool) -> None:
    """Refuse the first row where the bundle's ``file`` and what the run folder computes differ (a value, or a row
    only one side has)."""
    run, run_dir = where
    columns = ["value"] if numeric else list(BIN_VALUES)
    both = fresh[keys + columns].merge(recorded[keys + columns], on=keys, how="outer",
                                       suffixes=("", "_recorded"), indicator=True)
    if numeric:
        ours, theirs = (pd.to_numeric(both[c], errors="coerce").to_numpy(float) for c in ("value", "value_recorded"))
        differ = ~np.isclose(ours, theirs, rtol=RELATIVE, atol=1e-12, equal_nan=True)
    else:
        text = lambda column: both[column].fillna("").astype(str)  # noqa: E731
        differ = np.zeros(len(both), bool)
        for column in columns:
            differ |= (text(column) != text(f"{column}_recorded")).to_numpy()
    for rows, what in ((both[both["_merge"] == "left_only"], "is missing from what the bundle holds of"),
                       (both[both["_merge"] == "right_only"], "is in the bundle, and not what"),
                       (both[(both["_merge"] == "both") & differ], "differs from what")):
        if len(rows):
            first = rows.iloc[0]
            recorded_value = f" {float(first['value_recorded']):.8g}," if numeric and what == "differs from what" \
                else ""
            fresh_value = f"{float(first['value']):.8g}; " if numeric and what != "is in the bundle, and not what" \
                else ""
            raise UserError(f"{file} of run {run}: its {_row(first, keys)}{recorded_value} {what} its folder "
                            f"{run_dir} computes ({fresh_value}{len(rows)} row(s) in all): the bundle was edited or "
                            "the folder replaced. Restore the bundle from git, or move the run folder away to reuse "
                            "the bundle as it is.")


def _row(row: pd.Series, keys: list[str]) -> str:
    """A bundle row in words: ``val nll of task mean``, ``val nll at epoch 3``, ``test histogram of task a``."""
    if "metric" not in keys:
        return f"{row['split']} histogram of task {row['task']}"
    where = f"of task {row['task']}" if "task" in keys else f"at epoch {row['epoch']}"
    return f"{row['split']} {row['metric']} {where}"


def recorded_threads(out: Path) -> int | None:
    """The thread count campaign ``out``'s bundle recorded (None: none recorded)."""
    return _threads_of(bundles.read_bundle(bundles.bundle_dir(out)))


def _threads_of(bundle: bundles.Bundle | None) -> int | None:
    value = None if bundle is None else bundle.campaign.get(THREADS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def env_threads(env: tuple[tuple[str, str], ...]) -> int | None:
    """The torch threads of a campaign's thread environment (``launcher.thread_env``); None: torch's default."""
    count = dict(env).get("OMP_NUM_THREADS")
    return int(count) if count else None


def threads_record(threads: int | None, old: dict | None) -> dict:
    """campaign.json's ``threads`` entry: this command's count, else the one recorded (a tuning worker's or a
    curve's collector, which does not launch, keeps the campaign's)."""
    threads = threads or (old or {}).get(THREADS)
    return {THREADS: threads} if threads else {}


def with_threads(campaign, env: tuple[tuple[str, str], ...]):
    """``campaign`` with the thread count of ``env`` (the runs' OMP_NUM_THREADS) to record; a bundle that
    recorded another count refuses it: the resumed runs would give other numbers than the uninterrupted ones. The
    plan the bundle recorded binds too, whether or not this command names it (``preregistration``)."""
    mine = env_threads(env)
    bundle = bundles.read_bundle(bundles.bundle_dir(campaign.out))
    preregistration.check_recorded_plan(bundle)
    recorded = _threads_of(bundle)
    if recorded is not None and mine != recorded:
        raise UserError(f"{bundles.bundle_dir(campaign.out) / bundles.CAMPAIGN}: this campaign's runs trained on "
                        f"{recorded} thread(s) per run, and this command would train on "
                        f"{mine or 'torch default'}: a thread count orders float sums, so the numbers would "
                        f"differ. Give --threads {recorded}, or use another --out.")
    campaign.threads = mine
    return campaign
