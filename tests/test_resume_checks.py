"""A resume checks what it reuses: a recorded run against its folder, the thread count against the recorded one;
and campaign.json records the command with paths relative to the repository, not the machine's."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from mtl_cog.cli import sweep
from mtl_cog.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A finished two-run sweep (one epoch each, tiny synthetic data), trained on one thread."""
    root = tmp_path_factory.mktemp("sweep")
    out = root / "s"
    tiny = ["tracking=none", "train.epochs=1", "train.batch_size=32", "train.eval_batch_size=64",
            "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=3", "data.synthetic.train_size=64",
            "data.synthetic.val_size=40", "data.synthetic.test_size=30"]
    sweep.main(["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), *tiny, "--out", str(out),
                "--threads", "1", "--grid", "optim.follower_lr=1e-3,3e-2"])
    return out


@pytest.fixture
def copy(finished_sweep, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(finished_sweep, out)
    return out


def edit_results(out: Path, run: str, split: str, metric: str, value: float) -> None:
    path = out / "bundle" / "results.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith(f"{run},{split},mean,{metric},")]
    assert len(hits) == 1
    lines[hits[0]] = f"{run},{split},mean,{metric},{value}\n"
    path.write_bytes(gzip.compress("".join(lines).encode()))
    (out / "bundle" / "manifest.json").unlink()  # unsealed, as an old bundle: the run folder is what must catch it
    campaign = json.loads((out / "bundle" / "campaign.json").read_text())
    (out / "bundle" / "campaign.json").write_text(json.dumps({k: v for k, v in campaign.items() if k != "seal"}))


def test_a_resume_over_an_untouched_bundle_reuses_every_run(copy):
    assert sweep.main(["--resume", str(copy)]).name == "best_config.yaml"


@pytest.mark.parametrize("split, metric", [("val", "nll"), ("test", "accuracy")])
def test_a_resume_refuses_a_recorded_score_its_run_folder_contradicts(copy, split, metric):
    edit_results(copy, "run_00", split, metric, 0.5 if metric == "nll" else 0.99)
    before = (copy / "best_config.yaml").read_text()
    with pytest.raises(UserError, match=f"run run_00: its {split} {metric} of task mean 0.5|0.99"):
        sweep.main(["--resume", str(copy)])
    assert (copy / "best_config.yaml").read_text() == before  # nothing chosen from the edited number


def test_a_resume_refuses_a_run_folder_whose_files_changed(copy):
    predictions = copy / "run_01" / "predictions_val.npz"
    data = predictions.read_bytes()
    predictions.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # one bit of another run's file
    with pytest.raises(UserError, match="run run_01 is recorded as finished in the bundle, and its folder cannot"):
        sweep.main(["--resume", str(copy)])


def test_a_resume_trains_on_the_recorded_thread_count_and_refuses_another(copy):
    assert json.loads((copy / "sweep_args.json").read_text())["threads"] == 1
    assert json.loads((copy / "bundle" / "campaign.json").read_text())["threads"] == 1
    assert sweep.parse_args(["--resume", str(copy)]).threads == 1  # not this machine's default
    with pytest.raises(UserError, match="trained on --threads 1; resuming on 2"):
        sweep.parse_args(["--resume", str(copy), "--threads", "2"])


def test_a_rerun_with_another_thread_count_is_refused(copy):
    args = json.loads((copy / "sweep_args.json").read_text())
    with pytest.raises(UserError, match="trained on 1 thread.s. per run, and this command would train on 2"):
        sweep.main(["--config", args["config"], *args["overrides"], "--out", str(copy), "--threads", "2",
                    "--grid", *args["grid"]])


def test_the_recorded_command_names_no_path_of_the_machine(tmp_path, monkeypatch):
    from mtl_cog.experiments import portable

    code, repo, out = tmp_path / "lanes" / "x" / "code", tmp_path / "checkout", tmp_path / "lanes" / "x" / "out"
    monkeypatch.setattr(portable, "PACKAGE_PARENT", str(code))
    monkeypatch.setenv(portable.REPO_ENV, str(repo))
    command = [str(code / "scripts" / "leader_curve.py"), "--out", str(out), f"--protocol-dir={repo}/results/a",
               "--seeds", "0", "train.epochs=2", str(out / "runs")]
    assert portable.portable_command(command, out) == [
        "scripts/leader_curve.py", "--out", "<out>", "--protocol-dir=results/a", "--seeds", "0", "train.epochs=2",
        "<out>/runs"]
