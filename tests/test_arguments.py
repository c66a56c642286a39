"""Command-line values are checked where they are declared (``mtl_cog.config.arguments``), launchers
refuse what Slurm would reject, and a dry run refuses what the real command refuses (docs/guides/failure_paths.md).

Every case goes through the command's ``main`` under ``run_cli``: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
from test_robustness import REPO, script, tiny, user_error

from mtl_cog.config import load_config
from mtl_cog.config.arguments import Parser, distinct, real_number, whole_number
from mtl_cog.errors import UserError
from mtl_cog.experiments import launcher
from mtl_cog.experiments.launcher import RunJob, SubmititLauncher
from mtl_cog.experiments.sweep import DONE, run_state
from mtl_cog.runs import rundir

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    return script("train_mtl").main(tiny(tmp, "run_name=r", "train.epochs=2"))


def test_the_types_refuse_what_argparse_would_take():
    count = whole_number(1, 10, "a count")
    assert count("3") == 3
    for bad in ("0", "11", "2.5", "1e9", "nan", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            count(bad)
    radius = real_number(0, None, low_open=True, what="a radius")
    assert radius("0.5") == 0.5
    for bad in ("0", "-1", "nan", "inf", "-inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            radius(bad)
    with pytest.raises(UserError, match="lists 0 more than once"):
        distinct([0, 1, 0], "--seeds")


def test_the_parser_reports_one_error_line(capsys):
    parser = Parser(prog="cmd")
    parser.add_argument("--n", type=whole_number(1, None, "a count"))
    with pytest.raises(UserError, match=r"cmd: argument --n: expected a count in \[1, inf\], got 0 \(see cmd --help\)"):
        parser.parse_args(["--n", "0"])
    assert capsys.readouterr().err == ""  # no usage block


@pytest.mark.parametrize("command, argv, expected", [
    ("list_front", ["runs", "--out", "o", "--eps", "nan"], "--eps: expected a radius > 0, finite"),
    ("list_front", ["runs", "--out", "o", "--eps", "-0.1"], "--eps: expected a radius > 0"),
    ("list_front", ["runs", "--out", "o", "--ece", "accuracy"], "--ece: expected a calibration error such as ece@15"),
    ("list_front", ["runs", "--out", "o", "--ece", "ece@0"], "--ece: expected a calibration error"),
    ("sweep", ["--config", "c.yaml", "--grid", "seed=0,1", "--parallel", "0"], "--parallel: expected runs at a time"),
    ("reproduce", ["--seeds", "0", "0", "--dry-run"], "--seeds lists 0 more than once"),
    ("reproduce", ["--seeds", "-1", "--dry-run"], "--seeds: expected a seed in [0, 4294967295]"),
    ("reproduce", ["--budget", "1000000000", "--protocol", "fair", "--dry-run"], "--budget: expected a number of"),
    ("reproduce", ["--methods", "baseline", "baseline", "--dry-run"], "--method lists baseline more than once"),
    ("reproduce", ["--jobs", "0", "--dry-run"], "--jobs: expected runs at a time >= 1"),
    ("parameter_counts", ["--dataset", "celeba", "--classes", "2x100000000"], "100,000,000 tasks"),
    ("parameter_counts", ["--dataset", "cifar100", "--classes", "50000"], "matrix-calibrator entries"),
    ("evaluate", ["--predictions", "p.npz", "--out", "m.json", "--pairs", "-1"], "--pairs: expected a pair count"),
    ("compare", ["runs", "--out", "o", "--summary-bins", "0"], "--summary-bins: expected a bin count"),
    ("calibration_drift", ["--config", "c.yaml", "--every", "0"], "--every: expected epochs >= 1"),
    ("prepare_data", ["--image-size", "-3"], "--image-size: expected a size in pixels"),
    ("leader_curve", ["--config", "c.yaml", "--ratios", "nan"], "--ratios: expected a leader/follower ratio"),
    ("leader_curve", ["--config", "c.yaml", "--seeds", "1", "1"], "--seeds lists 1 more than once"),
    ("leader_curve", ["--config", "c.yaml", "--follower-lr", "0"], "--follower-lr: expected a learning rate"),
    ("benchmark", ["--steps", "-1"], "--steps: expected a positive integer"),
    ("benchmark", ["--image-size", "0"], "--image-size: expected a positive integer"),
])
def test_every_commands_numbers_are_checked_when_parsed(command, argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = user_error(command, argv, capsys)
    assert expected in err and err.count("\n") == 1 and "usage:" not in err


def test_a_synthetic_data_set_too_large_for_memory_is_refused_before_allocating(tmp_path, capsys):
    err = user_error("train_mtl", tiny(tmp_path, "data.synthetic.train_size=10000000000"), capsys)
    assert "data.synthetic: 10,000,000,064 samples" in err and "GiB of memory" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ launchers


@pytest.mark.parametrize("argv, expected", [
    (["--time-limit", "-5"], "--time-limit: expected minutes >= 1"),
    (["--cpus-per-run", "0"], "--cpus-per-run: expected a CPU count >= 1"),
    (["--gpus-per-run", "-2"], "--gpus-per-run: expected a GPU count >= 1"),
    (["--mem-per-run", "lots"], "--mem-per-run: expected a memory size such as 16GB"),
    (["--mem-per-run", "0G"], "--mem-per-run: expected a memory size"),
])
def test_slurm_values_are_checked_before_anything_is_submitted(argv, expected):
    parser = Parser(prog="sweep")
    launcher.add_launcher_arguments(parser)
    with pytest.raises(UserError, match=expected):
        parser.parse_args(["--launcher", "slurm", *argv])
    assert parser.parse_args(["--mem-per-run", "4000M"]).mem_per_run == "4000M"


class RefusingExecutor:
    """An executor whose sbatch refuses the array, as submitit reports it."""

    def batch(self):
        import contextlib
        return contextlib.nullcontext()

    def submit(self, *args):
        import submitit
        raise submitit.core.utils.FailedJobError(
            "Could not submit job\nsbatch: error: Batch job submission failed: Invalid partition name specified")


def test_an_sbatch_rejection_is_one_error_line(tmp_path):
    job = RunJob("r", ("true",), tmp_path / "r.log")
    with pytest.raises(UserError, match="Slurm refused the 1 job.*Invalid partition name specified.*nothing was"):
        SubmititLauncher(RefusingExecutor()).run([job])


@pytest.mark.parametrize("content", ["{not json", "[]", '{"config": "c.yaml"}', '{"config": "c.yaml", "grid": [], '
                                     '"overrides": []}', '{"config": 3, "grid": ["seed=0,1"], "overrides": []}'])
def test_sweep_resume_with_a_damaged_or_incomplete_sweep_args_file(tmp_path, capsys, content):
    (tmp_path / "sweep_args.json").write_text(content)
    err = user_error("sweep", ["--resume", str(tmp_path)], capsys)
    assert f"{tmp_path / 'sweep_args.json'} is damaged or incomplete" in err and f"--out {tmp_path}" in err


def test_a_moved_reproduction_folder_is_continued_not_refused(finished, tmp_path):
    """The run's own location (output_dir) is no setting: a moved folder's runs are reused."""
    moved = tmp_path / "elsewhere" / "runs"
    shutil.copytree(finished.parent, moved)
    cfg = load_config(finished / rundir.CONFIG, [f"output_dir={moved}"])
    assert run_state(moved / finished.name, cfg) == DONE
    other = load_config(finished / rundir.CONFIG, [f"output_dir={moved}", "optim.follower_lr=0.5"])
    with pytest.raises(UserError, match=r"other settings than this one's \(optim.follower_lr\)"):
        run_state(moved / finished.name, other)


# ---------------------------------------------------------------------------------------- dry runs


def test_a_dry_run_refuses_an_output_dir_the_real_run_refuses(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    err = user_error("train_mtl", [*tiny(tmp_path, f"output_dir={tmp_path / 'file'}"), "--dry-run"], capsys)
    assert "output_dir" in err and "is a file, not a folder" in err


def test_a_dry_run_refuses_a_new_run_over_a_finished_one(finished, tmp_path, capsys):
    shutil.copytree(finished, tmp_path / "runs" / "r")
    err = user_error("train_mtl", [*tiny(tmp_path, "run_name=r"), "--dry-run"], capsys)
    assert "already holds a finished run" in err


@pytest.mark.parametrize("key, expected", [
    ("model.backbone=resnet18", "model.backbone"),
    ("train.epochs=1", "train.epochs=1 is below the 2"),
])
def test_a_dry_run_refuses_a_resume_key_the_real_resume_refuses(finished, tmp_path, capsys, key, expected):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    (run / rundir.DONE).unlink()  # as if killed after its last epoch
    before = (run / rundir.CONFIG).read_text()
    err = user_error("train_mtl", ["--resume", str(run), key, "--dry-run"], capsys)
    assert expected in err and (run / rundir.CONFIG).read_text() == before
    script("train_mtl").main(["--resume", str(run), "--dry-run", "train.epochs=4"])  # an applied change passes


@pytest.mark.parametrize("command, argv", [
    ("sweep", ["--config", str(REPO / "configs" / "synthetic" / "baseline.yaml"), "--grid", "seed=0,1", "--dry-run"]),
    ("reproduce", ["--data", "synthetic", "--method", "baseline", "--seeds", "0", "--dry-run"]),
])
def test_sweep_and_reproduce_dry_runs_refuse_what_the_real_command_refuses(command, argv, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    err = user_error(command, [*argv, "--out", str(tmp_path / "file")], capsys)
    assert "--out" in err and "is a file, not a folder" in err
    monkeypatch.setattr(launcher.shutil, "which", lambda name: None)  # no Slurm here
    err = user_error(command, [*argv, "--out", str(tmp_path / "o"), "--launcher", "slurm"], capsys)
    assert "needs Slurm's sbatch on PATH" in err and not (tmp_path / "o").exists()
