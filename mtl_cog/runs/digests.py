"""``digests.json``: what a finished run wrote together, fingerprinted when it was written.

A run's files only make sense together: the weights were trained on data normalised by the
``task_spec.json`` beside them, under the ``config.yaml`` beside them, and the predictions and
``test_metrics.csv`` came from those weights. A file that parses can still be a different one
(an edited spec, weights copied from another run, a predictions file from an older run), and
every number computed from such a mix is wrong without any error. So the run records the
xxh3-128 digest and size of each of these files just before it writes ``DONE``
(``record_digests``), and every reader checks the files it is about to use against that record
(``verify_digests``) before it trusts them. xxh3 hashes at memory speed (tens of GB/s), so a
check costs about one read of the files, which the reader does anyway.

Like the cache's checksums this detects accidents and mix-ups (a file copied, restored or edited
by hand), not an attacker, who could rewrite ``digests.json`` as well.

Some files are written into a run after it finished, or at its end beside the covered ones: post-hoc
calibrators' metrics and predictions (``evaluate --posthoc``, a campaign's collection), the metrics under
corruptions (``shift_metrics.csv``) and per subgroup (``group_metrics.csv``). Their writer adds them to
the record (``add_digests``), and their readers check them like the rest (``later_files``). The
record's format is versioned: ``v2`` records those files too, so a v2 run with such a file missing from
its record is refused; a ``v1`` record (runs finished before) still loads, and its later files are read
with a warning that they cannot be checked.

Runs finished before digests were recorded have no ``digests.json``. They are accepted with a
warning rather than refused: their files still get every type and range check (weights of the
model's dtype and shapes, finite values, a valid task spec), and refusing would make every such
run, often hours of training, unusable with no way to repair it other than retraining.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from mtl_cog.data.cache import file_checksum as file_digest  # xxh3-128, chunked reads
from mtl_cog.errors import RunFolderError
from mtl_cog.io import atomic_write_json
from mtl_cog.runs import rundir

FORMAT = "mtl_cog.run_digests.v2"  # v2: the files written after the run finished are recorded too (add_digests)
FORMATS = ("mtl_cog.run_digests.v1", FORMAT)  # what loads
ALGORITHM = "xxh3_128"


def covered_files() -> tuple[str, ...]:
    """The files of a finished run whose content readers depend on (the figures are only looked at)."""
    return (rundir.CONFIG, rundir.TASK_SPEC, rundir.BEST_MODEL, rundir.STAGE_ONE_MODEL, rundir.PARAMS,
            rundir.TEST_METRICS, rundir.TRUTH_METRICS, rundir.predictions_file("val"),
            rundir.predictions_file("test"), *(rundir.predictions_file(rundir.last_epoch_split(s))
                                               for s in ("val", "test")))


def later_files(run_dir: Path) -> list[str]:
    """The files of ``run_dir`` that may be written after its covered ones: post-hoc metrics and predictions,
    shift and subgroup metrics (those present)."""
    fixed = [rundir.POSTHOC_METRICS, rundir.POSTHOC_JSON, rundir.SHIFT_METRICS, rundir.GROUP_METRICS]
    prefix = rundir.posthoc_predictions_file("test", "")[: -len(".npz")]
    covered = set(covered_files())
    posthoc = [p.name for p in sorted(run_dir.glob(f"{prefix}*.npz")) if p.name not in covered]
    return [name for name in fixed if (run_dir / name).is_file()] + posthoc


def _entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, ALGORITHM: file_digest(path)}


def record_digests(run_dir: Path) -> None:
    """Write ``digests.json`` for the covered files present in ``run_dir`` and the later ones already written
    (main process, before ``DONE``)."""
    files = {name: _entry(run_dir / name) for name in [*covered_files(), *later_files(run_dir)]
             if (run_dir / name).is_file()}
    atomic_write_json(run_dir / rundir.DIGESTS, {"format": FORMAT, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                 "files": files})


def add_digests(run_dir: str | Path, names: list[str] | tuple[str, ...]) -> None:
    """Add the files ``names``, just written into ``run_dir`` (after it finished), to its record, which becomes
    v2; a run without a record (from before digests, or not finished yet: ``record_digests`` covers them) is
    left as it is."""
    run_dir = Path(run_dir)
    files = _read_record(run_dir)
    if files is None or not (run_dir / rundir.DONE).exists():
        return
    # a v1 record becomes v2: the later files already there (read unchecked until now) are recorded as they are,
    # or v2 would refuse them
    if files.pop(OLD_RECORD, None) is not None:
        names = [*later_files(run_dir), *names]
    files.update({name: _entry(run_dir / name) for name in names if (run_dir / name).is_file()})
    atomic_write_json(run_dir / rundir.DIGESTS, {"format": FORMAT, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                 "files": files})


def _read_record(run_dir: Path) -> dict[str, dict] | None:
    path = run_dir / rundir.DIGESTS
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        files = raw["files"]
        if raw.get("format") not in FORMATS or not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get(ALGORITHM), str)
                for v in files.values()):
            raise ValueError("not in the format runs write")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunFolderError(f"{path} is damaged ({err}); the run's files cannot be checked against what wrote "
                             "them. Restore the run folder from a copy, or retrain.") from None
    if raw["format"] != FORMAT:
        files = {**files, OLD_RECORD: {}}  # marks a v1 record for verify_digests (not a file name: it has a slash)
    return files


OLD_RECORD = "/v1"


def verify_digests(run_dir: str | Path, names: tuple[str, ...] | list[str]) -> None:
    """Refuse if any of ``names`` (files of ``run_dir``) differs from what the run recorded.

    A file the record lists must exist with its recorded size and digest; a covered file present
    now but not in the record was added after the run finished and is refused too. Without a
    record (a run from before digests), a warning says the files are checked for types and ranges only.
    """
    run_dir = Path(run_dir)
    record = _read_record(run_dir)
    if record is None:
        if (run_dir / rundir.DONE).exists():
            warnings.warn(f"{run_dir} has no {rundir.DIGESTS} (finished before runs recorded digests): its files "
                          "are checked for types and ranges, but not against what wrote them.", stacklevel=2)
        return
    for name in names:
        path = run_dir / name
        expected = record.get(name)
        if expected is None and OLD_RECORD in record and name in later_files(run_dir):
            warnings.warn(f"{path} was written after its run finished, by code from before such files were "
                          f"recorded in {rundir.DIGESTS}: it is read unchecked.", stacklevel=2)
            continue
        if expected is None:
            if path.exists():
                raise RunFolderError(f"{path} was not written by this run (it is not in {rundir.DIGESTS}); it "
                                     "was added after the run finished. Remove it, or restore the run folder.")
            continue
        if not path.is_file():
            raise RunFolderError(f"{path} is missing, but the run wrote it ({rundir.DIGESTS}). Restore the run "
                                 "folder from a copy, or retrain.")
        if path.stat().st_size != expected["bytes"] or file_digest(path) != expected[ALGORITHM]:
            raise RunFolderError(
                f"{path} is not the file this run wrote: its content differs from the digest recorded in "
                f"{rundir.DIGESTS} (edited, replaced or copied from another run). Restore the run folder from a "
                "copy, or retrain."
            )
