"""A results bundle is evidence: sealed by a manifest written last, every column checked against one schema,
runs.csv's labels those campaign.json planned; a mismatch is one error line naming the file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from mtl_cog.bundles import bundle as bundles
from mtl_cog.errors import UserError

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"


def write_labelled_bundle(folder: Path, splits=("val", "test")) -> None:
    """Two sweep runs of cog_ts on synthetic, with their labels recorded in campaign.json's specs as a campaign
    records them (``campaign.spec_record``)."""
    specs, bundle = {}, bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    for i, ratio in enumerate((0.1, 1.0)):
        run = f"run_{i:02d}"
        labels = {"data": "synthetic", "method": "cog_ts", "role": "sweep", "seed": 0, "draw": "",
                  "trial": f"{i:02d}", "ratio": ratio}
        specs[run] = {"digest": f"d{i}", "labels": labels}
        row = {c: "" for c in bundles.RUN_COLUMNS} | labels | {
            "run": run, "campaign": "c", "status": "done", "config_digest": f"d{i}", "epochs_run": 2,
            "wall_s": 3.5, "threads": "1", "converged": True}
        results = pd.DataFrame([{"run": run, "split": split, "task": task, "metric": metric, "value": 0.5 + i / 10}
                                for split in splits for task in ("a", "mean") for metric in ("nll", "accuracy")])
        curves = pd.DataFrame([{"run": run, "epoch": e, "split": "val", "metric": "nll", "value": 0.7 - e / 10}
                               for e in (1, 2)])
        bundle.add_run(row, results, curves)
    bundle.campaign["specs"] = specs
    bundles.write_bundle(folder, bundle)


def read(folder: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bundles.read_bundle(folder)


def edit_csv(path: Path, old: str, new: str, count: int = 1) -> None:
    gz = path.name.endswith(".gz")
    text = gzip.decompress(path.read_bytes()).decode() if gz else path.read_text()
    assert old in text, (old, text[:300])
    text = text.replace(old, new, count)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())


def test_a_written_bundle_is_sealed_and_reads_back_without_a_warning(tmp_path):
    write_labelled_bundle(tmp_path / "b", splits=("val", "test", "test+ts", "val@last", "test@last",
                                                  "test@last+ts"))
    assert (tmp_path / "b" / MANIFEST).is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bundle = bundles.read_bundle(tmp_path / "b")
    assert len(bundle.runs) == 2 and set(bundle.results["split"]) >= {"val@last", "test@last+ts"}


@pytest.mark.parametrize("edit", [
    lambda f: edit_csv(f / bundles.RESULTS, "val,mean,nll,0.5", "val,mean,nll,0.4"),  # chooses another run
    lambda f: edit_csv(f / bundles.RUNS, ",done,", ",failed,"),
    lambda f: (f / bundles.CAMPAIGN).write_text((f / bundles.CAMPAIGN).read_text().replace('"c"', '"c" ')),
    lambda f: (f / bundles.CURVES).unlink(),
])
def test_an_edited_file_of_a_sealed_bundle_is_refused_naming_it(tmp_path, edit):
    write_labelled_bundle(tmp_path)
    edit(tmp_path)
    with pytest.raises(UserError, match=r"(results.csv.gz|runs.csv|campaign.json|curves.csv.gz) (is not the file "
                                        r"the campaign sealed|is missing)"):
        read(tmp_path)


def test_a_file_added_after_the_seal_is_refused(tmp_path):
    write_labelled_bundle(tmp_path)
    (tmp_path / bundles.TRIALS).write_text("study,trial,state\ns,0,complete\n")
    with pytest.raises(UserError, match="trials.csv is not in the bundle's manifest.json"):
        read(tmp_path)


def test_a_sealed_file_inflated_with_well_formed_rows_is_refused_before_it_is_read(tmp_path, monkeypatch):
    write_labelled_bundle(tmp_path)
    path = tmp_path / bundles.RESULTS
    text = gzip.decompress(path.read_bytes()).decode()
    path.write_bytes(gzip.compress((text + text.split("\n", 1)[1].replace("run_0", "run_9") * 50).encode()))
    with pytest.raises(UserError, match="results.csv.gz is not the file the campaign sealed"):
        read(tmp_path)
    (tmp_path / MANIFEST).unlink()  # unsealed: reads stop at the bound
    monkeypatch.setattr(bundles.manifest, "UNSEALED_MAX_ROWS", 100)
    with pytest.raises(UserError, match="more than 100 rows"):
        read(tmp_path)


def test_an_unsealed_bundle_is_read_with_a_notice_and_sealed_by_its_next_write_or_seal(tmp_path, capsys):
    write_labelled_bundle(tmp_path / "b")
    (tmp_path / "b" / MANIFEST).unlink()  # the manifest lost: campaign.json still records the seal
    bundles.read_bundle(tmp_path / "b")
    assert "its manifest.json is missing" in capsys.readouterr().err
    before = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    assert bundles.seal_bundle(tmp_path / "b") and not bundles.seal_bundle(tmp_path / "b")
    assert {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir() if p.name != MANIFEST} == before
    edit_csv(tmp_path / "b" / bundles.RESULTS, "val,mean,nll,0.5", "val,mean,nll,0.4")
    with pytest.raises(UserError, match="results.csv.gz is not the file the campaign sealed"):
        read(tmp_path / "b")
    write_labelled_bundle(tmp_path / "old")
    (tmp_path / "old" / MANIFEST).unlink()  # a bundle of the code before seals: no record of one either
    campaign = json.loads((tmp_path / "old" / bundles.CAMPAIGN).read_text())
    (tmp_path / "old" / bundles.CAMPAIGN).write_text(json.dumps({k: v for k, v in campaign.items() if k != "seal"}))
    old = bundles.read_bundle(tmp_path / "old")
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and err.count("\n") == 1 and "unsealed results bundle" in err
    bundles.write_bundle(tmp_path / "c", old)
    assert (tmp_path / "c" / MANIFEST).is_file() and bundles.read_bundle(tmp_path / "c") is not None


@pytest.mark.parametrize("file, old, new, said", [
    (bundles.RUNS, ",sweep,", ",banana,", "column role: 'banana' is not one of trial, final, curve, sweep"),
    (bundles.RUNS, ",done,", ",finished,", "column status"),
    (bundles.RUNS, ",2,True,3.5,", ",two,True,3.5,", "column epochs_run: 'two'"),
    (bundles.RUNS, ",3.5,", ",nan,", "column wall_s: 'nan' is not a finite number"),
    (bundles.RUNS, ",0.1,0,", ",0.1,12345678901234567890123,", "column seed"),
    (bundles.RUNS, ",0.1,0,", ",abc,0,", "column ratio: 'abc'"),
    (bundles.RUNS, ",True,3.5,1,", ",True,3.5,one,", "column threads"),
    (bundles.CURVES, "run_00,1,", "run_00,x,", "column epoch: 'x' is not a whole number"),
    (bundles.RESULTS, "run_00,test,a,nll,0.5", "run_00,test,a,nll,inf", "column value: 'inf' is not a finite"),
    (bundles.RESULTS, "run_00,test,a,nll,0.5", "run_00,test?,a,nll,0.5", "column split"),
    (bundles.RESULTS, "run_00,test,a,nll,0.5\n", "run_00,test,a,nll,0.5\nrun_00,test,a,nll,0.9\n",
     "2 rows for run=run_00, split=test, task=a, metric=nll, with contradicting values"),
    (bundles.CURVES, "run_00,1,val,nll,0.6\n", "run_00,1,val,nll,0.6\nrun_00,1,val,nll,0.6\n", "2 rows for run"),
    (bundles.RUNS, ",synthetic,cog_ts,", ",synthetic,baseline,", "method in runs.csv is 'baseline', and "
                                                                "campaign.json planned it as 'cog_ts'"),
    (bundles.RUNS, ",synthetic,cog_ts,", ",celeba,cog_ts,", "data in runs.csv is 'celeba'"),
])
def test_a_cell_that_is_not_what_its_column_means_is_refused_in_one_line(tmp_path, file, old, new, said):
    write_labelled_bundle(tmp_path)
    (tmp_path / MANIFEST).unlink()  # unsealed, as an old bundle: the schema alone must refuse it
    edit_csv(tmp_path / file, old, new)
    with pytest.raises(UserError, match=f"{file}" if "planned" not in said else "inconsistent") as err:
        read(tmp_path)
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("replace", ["folder", "link"])
def test_a_bundle_file_that_is_a_folder_or_a_link_is_refused_not_read_as_no_runs(tmp_path, replace):
    write_labelled_bundle(tmp_path / "b")
    runs = tmp_path / "b" / bundles.RUNS
    runs.unlink()
    if replace == "folder":
        runs.mkdir()
    else:
        runs.symlink_to("/dev/zero")  # a link to an endless file
    with pytest.raises(UserError, match="runs.csv: a results bundle's files are regular files"):
        read(tmp_path / "b")


def test_the_report_command_seals_a_bundle_and_refuses_an_edited_one_in_one_line(tmp_path):
    write_labelled_bundle(tmp_path / "out" / "bundle")
    (tmp_path / "out" / "bundle" / MANIFEST).unlink()
    command = [sys.executable, "-m", "mtl_cog.cli.main", "report", "--bundle", str(tmp_path / "out" / "bundle")]
    sealed = subprocess.run([*command, "--seal"], capture_output=True, text=True, cwd=REPO)
    assert sealed.returncode == 0 and "manifest.json: written" in sealed.stdout, sealed.stderr
    edit_csv(tmp_path / "out" / "bundle" / bundles.RESULTS, "test,mean,accuracy,0.5", "test,mean,accuracy,0.99")
    refused = subprocess.run([*command, "--list"], capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and refused.stderr.count("error:") == 1 and "Traceback" not in refused.stderr
    assert "results.csv.gz is not the file the campaign sealed" in refused.stderr
