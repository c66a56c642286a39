"""The dry run's estimate of what a campaign still has to run, and the pace its finished runs measured.

The estimate is a model (``gpu_time.estimate_run``: a measured training throughput, start-up and scoring); a
campaign that has already finished runs knows better, so the dry run prints the runs' own median wall time
beside the model's figure: two numbers side by side, the user sizes with the larger.
"""

from __future__ import annotations

import pandas as pd

from mtl_cog.bundles import bundle as bundles
from mtl_cog.experiments import gpu_time
from mtl_cog.experiments.campaign import Planned, print_counts
from mtl_cog.experiments.sweep import NEW, UNFINISHED

MIN_MEASURED = 2  # finished runs before their median is a pace worth printing


def estimate(planned: list[Planned], measured, extra: tuple[float, float] = (0.0, 0.0)) -> dict:
    """Seconds still to run: ``device`` (GPU rates, one device each) and ``cpu`` (one-core rates: core-seconds);
    ``extra`` adds (device, cpu) seconds planned elsewhere (the tuning)."""
    todo = [p for p in planned if p.state in (NEW, UNFINISHED)]
    estimates = [gpu_time.estimate_run(p.config, measured) for p in todo]
    return {"runs": len(planned), "todo": len(todo),
            "device": sum(e.seconds for e in estimates if not e.on_cpu) + extra[0],
            "cpu": sum(e.seconds for e in estimates if e.on_cpu) + extra[1],
            "sources": sorted({e.source for e in estimates})}


def print_estimate(planned: list[Planned], measured, parallel: int, what: str = "runs",
                   extra: tuple[float, float] = (0.0, 0.0), note: str = "", out=None) -> dict:
    """The dry run's estimate line: GPU-hours and CPU core-hours still to run, and the wall time; on CPUs, with
    ``out`` (the campaign's folder), the pace its finished runs measured beside it."""
    result = estimate(planned, measured, extra)
    print_counts(planned, what)
    parts = []
    if result["device"] or not result["cpu"]:
        parts.append(f"{result['device'] / 3600:.1f} GPU-hours (~{gpu_time.format_duration(result['device'])} "
                     "of one device)")
    if result["cpu"]:
        parts.append(f"{result['cpu'] / 3600:.1f} CPU core-hours (~{gpu_time.format_duration(result['cpu'] / parallel)}"
                     f" wall with {parallel} at a time)")
    print(f"estimated: {' + '.join(parts)} still to run{note} (throughput: "
          f"{'; '.join(result['sources']) or 'nothing to run'})")
    pace = measured_pace(planned, out) if out is not None and result["cpu"] else None
    if pace:
        print(pace)
    return result


def measured_pace(planned: list[Planned], out) -> str | None:
    """The median core-seconds (wall time × threads) of this campaign's finished runs among ``planned``, per data
    set, and what its final runs still to run take at that pace (tuning not included); None before ``MIN_MEASURED``
    runs of a data set have finished."""
    bundle = bundles.read_bundle(bundles.bundle_dir(out))
    if bundle is None:
        return None
    done = bundle.done()
    mine = done[done["run"].isin({p.spec.run for p in planned})]
    core_seconds = (pd.to_numeric(mine["wall_s"], errors="coerce")
                    * pd.to_numeric(mine["threads"], errors="coerce").fillna(1).clip(lower=1))
    lines = []
    for data, seconds in core_seconds.groupby(mine["data"].astype(str), sort=True):
        seconds = seconds.dropna()
        if len(seconds) < MIN_MEASURED:
            continue
        todo = sum(p.state in (NEW, UNFINISHED) and p.spec.labels.data == data for p in planned)
        pace = float(seconds.median())
        lines.append(f"measured on {data}: {len(seconds)} finished runs of this campaign took {pace:.0f} core-seconds "
                     f"each (median); at that pace its {todo} final runs still to run take {todo * pace / 3600:.1f} "
                     "CPU core-hours (tuning not included)")
    return "\n".join(lines) or None
