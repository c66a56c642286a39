"""What a resumed campaign reuses, checked first: a recorded run against its folder, the thread count it ran on.

A campaign resumed over its bundle (``campaign.plan``) trains nothing the bundle records as done, and
then chooses, pools and reports from the bundle's numbers. So:

- **a recorded run whose folder is still there must agree with it**: its files against the digests it
  recorded (``runs.digests``), and its validation and test scores, recomputed from its predictions, against
  ``results.csv.gz``'s (to the 8 significant digits a bundle keeps). An edited validation NLL made a
  resumed sweep choose another run; now it is refused, naming the run, the score and both values.
- **the options that change numbers are the campaign's own**: the torch thread count (a float sum is
  ordered by it, so a resume on another count gives other numbers) is recorded in ``campaign.json``
  (``threads``); a resume without ``--threads`` reuses it (``recorded_threads``), and one whose thread count
  contradicts it is refused (``with_threads``). Precision and every other setting of a run are in its
  config digest already (``campaign.config_digest``), which a resume compares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.experiments import preregistration
from mtl_cog.reporting import bundle as bundles
from mtl_cog.reporting.bundle_rows import results_rows
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import covered_files, verify_digests

THREADS = "threads"  # campaign.json's key: torch threads per CPU run (absent: torch's default, GPU runs)
COMPARED_SPLITS = ("val", "test", "val@last", "test@last")  # the scores of the run itself (post-hoc fits aside)
RELATIVE = 1e-6  # a bundle keeps 8 significant digits


def check_run_folder(bundle: bundles.Bundle, run: str, run_dir: Path) -> None:
    """Refuse to reuse ``run`` as the bundle records it when its finished folder (if still there) disagrees."""
    if not (run_dir / rundir.DONE).is_file():
        return  # no folder (a fresh clone of the bundle) or an unfinished one: the bundle is all there is
    try:
        verify_digests(run_dir, covered_files())
        fresh = results_rows(run_dir, ())
    except (RunFolderError, UserError) as err:
        raise UserError(f"run {run} is recorded as finished in the bundle, and its folder cannot be checked "
                        f"against it: {err}") from None
    fresh = fresh[fresh["split"].isin(COMPARED_SPLITS)]
    recorded = bundle.results[(bundle.results["run"] == run) & bundle.results["split"].isin(COMPARED_SPLITS)]
    both = fresh.merge(recorded, on=["split", "task", "metric"], how="left", suffixes=("", "_recorded"))
    missing = both[both["value_recorded"].isna()]
    differ = both[both["value_recorded"].notna() & ~np.isclose(both["value"].astype(float),
                                                               both["value_recorded"].astype(float),
                                                               rtol=RELATIVE, atol=1e-12)]
    for rows, what in ((differ, "differs from"), (missing, "is missing from")):
        if len(rows):
            first = rows.iloc[0]
            recorded_value = "" if what == "is missing from" else f" {float(first['value_recorded']):.8g},"
            raise UserError(f"{bundles.RESULTS} of run {run}: its {first['split']} {first['metric']} of task "
                            f"{first['task']}{recorded_value} {what} what its folder {run_dir} computes "
                            f"({float(first['value']):.8g}; {len(rows)} score(s) in all): the bundle was edited or "
                            "the folder replaced. Restore the bundle from git, or move the run folder away to "
                            "reuse the bundle as it is.")


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
