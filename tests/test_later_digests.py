"""Files written into a run after it finished (post-hoc, shift and subgroup outputs) are under its digests: their
writer records them, their readers check them; a run recorded before (digests v1) still loads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from mtl_cog.errors import RunFolderError
from mtl_cog.runs import digests, rundir


def finished_run(folder: Path, shift: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / rundir.CONFIG).write_text("seed: 0\n")
    (folder / rundir.TEST_METRICS).write_text("task,nll\nmean,0.5\n")
    if shift:  # written at the end of the run, before DONE
        (folder / rundir.SHIFT_METRICS).write_text("corruption,severity,method,task,accuracy\nfog,1,none,mean,0.5\n")
    digests.record_digests(folder)
    (folder / rundir.DONE).write_text("best_epoch=1\n")
    return folder


def test_a_file_written_at_the_end_of_the_run_is_recorded_with_the_rest(tmp_path):
    run = finished_run(tmp_path / "r", shift=True)
    record = json.loads((run / rundir.DIGESTS).read_text())
    assert record["format"] == "mtl_cog.run_digests.v2" and rundir.SHIFT_METRICS in record["files"]
    (run / rundir.SHIFT_METRICS).write_text("corruption,severity,method,task,accuracy\nfog,1,none,mean,0.9\n")
    with pytest.raises(RunFolderError, match="shift_metrics.csv is not the file this run wrote"):
        digests.verify_digests(run, [rundir.SHIFT_METRICS])


def test_a_file_written_after_the_run_finished_is_added_by_its_writer_and_checked_by_its_reader(tmp_path):
    run = finished_run(tmp_path / "r")
    (run / rundir.POSTHOC_METRICS).write_text("method,nll\nnone,0.5\nts,0.4\n")
    with pytest.raises(RunFolderError, match="was not written by this run"):  # not (yet) in the record
        digests.verify_digests(run, digests.later_files(run))
    digests.add_digests(run, [rundir.POSTHOC_METRICS])
    digests.verify_digests(run, digests.later_files(run))
    (run / rundir.POSTHOC_METRICS).write_text("method,nll\nnone,0.5\nts,0.1\n")  # a better calibrator, by hand
    with pytest.raises(RunFolderError, match="posthoc_metrics.csv is not the file this run wrote"):
        digests.verify_digests(run, digests.later_files(run))


def test_the_shift_table_refuses_an_edited_shift_file(tmp_path):
    from mtl_cog.reporting.shift_report import method_shift_table

    run = finished_run(tmp_path / "r", shift=True)
    (run / rundir.SHIFT_METRICS).write_text((run / rundir.SHIFT_METRICS).read_text().replace("0.5", "0.9"))
    record = SimpleNamespace(run_dir=str(run), method="baseline", dataset="synthetic", seed=0)
    with pytest.raises(RunFolderError, match="shift_metrics.csv is not the file this run wrote"):
        method_shift_table([record])


def test_a_subgroup_table_refuses_an_edited_group_file(tmp_path):
    from mtl_cog.reporting.html_inputs import subgroup_table

    run = finished_run(tmp_path / "r")
    frame = pd.DataFrame({"group": ["a"], "task": ["t"], "nll": [0.5]})
    frame.to_csv(run / rundir.GROUP_METRICS, index=False)
    digests.add_digests(run, [rundir.GROUP_METRICS])
    record = SimpleNamespace(run_dir=str(run), method="baseline", dataset="synthetic", seed=0)
    assert len(subgroup_table([record])) == 1
    frame.assign(nll=0.1).to_csv(run / rundir.GROUP_METRICS, index=False)
    with pytest.raises(RunFolderError, match="group_metrics.csv is not the file this run wrote"):
        subgroup_table([record])


def test_a_run_recorded_before_v2_still_loads_and_is_upgraded_by_the_next_writer(tmp_path):
    run = finished_run(tmp_path / "r")
    record = json.loads((run / rundir.DIGESTS).read_text())
    (run / rundir.DIGESTS).write_text(json.dumps({**record, "format": "mtl_cog.run_digests.v1"}))
    (run / rundir.SHIFT_METRICS).write_text("corruption,severity,method,task,accuracy\nfog,1,none,mean,0.5\n")
    with pytest.warns(UserWarning, match="read unchecked"):  # an old run's later file: loads, with a warning
        digests.verify_digests(run, [rundir.CONFIG, *digests.later_files(run)])
    (run / rundir.POSTHOC_METRICS).write_text("method,nll\nnone,0.5\n")
    digests.add_digests(run, [rundir.POSTHOC_METRICS])
    upgraded = json.loads((run / rundir.DIGESTS).read_text())
    assert upgraded["format"] == "mtl_cog.run_digests.v2"
    assert {rundir.SHIFT_METRICS, rundir.POSTHOC_METRICS} <= set(upgraded["files"]) and "/v1" not in upgraded["files"]
    digests.verify_digests(run, digests.later_files(run))


def test_the_last_epochs_predictions_are_no_post_hoc_variant(tmp_path):
    from mtl_cog.bundles.run_records import _posthoc_variants

    run = tmp_path / "r"
    run.mkdir()
    for split in ("test_last", "test_ts"):  # the last epoch's network (eval.score_last_epoch), a calibrator's
        (run / f"predictions_{split}.npz").write_bytes(b"")
    assert [v.method for v in _posthoc_variants(run, "baseline")] == ["baseline+ts"]
