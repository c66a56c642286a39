"""Launchers (local pool, submitit); sweeps that resume, never choose from an incomplete grid, run in cwd."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtl_cog.config import load_config, save_config
from mtl_cog.errors import UserError
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.experiments.launcher import LocalLauncher, RunJob, SubmititLauncher, python_module_command
from mtl_cog.runs import rundir

REPO = Path(__file__).resolve().parents[1]
PROBE = "import os, sys; print('cwd', os.getcwd()); print('env', os.environ.get('PROBE')); sys.exit(int(sys.argv[1]))"


def probe_jobs(tmp_path: Path, cwd: Path) -> list[RunJob]:
    return [RunJob(f"probe{code}", (sys.executable, "-c", PROBE, str(code)), tmp_path / f"probe{code}.log", cwd,
                   (("PROBE", f"value{code}"),)) for code in (0, 3)]


@pytest.mark.parametrize("kind", ["local", "submitit"])
def test_launchers_run_in_the_users_folder_and_return_exit_codes(tmp_path, kind, submitit_local):
    cwd = tmp_path / "where_the_user_is"
    cwd.mkdir()
    jobs = probe_jobs(tmp_path, cwd)
    launcher = (LocalLauncher(2, visible_gpus=0) if kind == "local"
                else SubmititLauncher(submitit_local, poll_seconds=0.2))
    assert launcher.run(jobs) == [0, 3]
    for job, code in zip(jobs, (0, 3)):
        log = job.log.read_text()
        assert f"cwd {cwd}" in log and f"env value{code}" in log


def test_local_gpu_slots_never_share_a_gpu():
    launcher = LocalLauncher(parallel=5, gpus_per_run=2, visible_gpus=4)
    assert launcher.parallel == 2
    assert launcher._slot_env(0) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert launcher._slot_env(1) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(UserError, match="gpus-per-run 8"):
        LocalLauncher(parallel=1, gpus_per_run=8, visible_gpus=4)
    assert LocalLauncher(parallel=3, visible_gpus=0).parallel == 3  # CPU: parallel as asked


def test_several_gpus_per_run_means_an_accelerate_launch_of_its_own():
    one = python_module_command("mtl_cog.cli.train", ["--config", "c.yaml"], 1, "runs/a")
    assert one == [sys.executable, "-m", "mtl_cog.cli.train", "--config", "c.yaml"]
    many = python_module_command("mtl_cog.cli.train", ["--config", "c.yaml"], 4, "runs/a")
    assert many[1:3] == ["-m", "accelerate.commands.launch"] and many[many.index("--num_processes") + 1] == "4"
    assert "--multi_gpu" in many and many[-4:] == ["-m", "mtl_cog.cli.train", "--config", "c.yaml"]
    other = python_module_command("mtl_cog.cli.train", [], 4, "runs/b")
    port = many.index("--main_process_port") + 1
    assert many[port] != other[port]  # runs sharing a node do not share a rendezvous port


def fake_finished_run(run: Path, cfg, nll_scale: float = 1.0) -> None:
    """A finished run folder as far as a campaign reads it: config, task spec, predictions of both splits, DONE
    (no digests: a run from before they were recorded, checked against its task spec)."""
    from mtl_cog.data.task_api import TaskSpec
    from mtl_cog.runs.task_spec import save_task_spec

    run.mkdir(parents=True)
    save_config(cfg, run / rundir.CONFIG)
    save_task_spec(TaskSpec("digits", ("digit",), (10,), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), run / rundir.TASK_SPEC)
    rng = np.random.default_rng(0)
    for split in ("val", "test"):
        save_predictions(run / rundir.predictions_file(split),
                         Predictions(["digit"], [rng.normal(0, nll_scale, (20, 10))], [rng.integers(0, 10, 20)]))
    (run / rundir.DONE).write_text("best_epoch=1\n")


def sweep_args(out: Path, grid: str) -> list[str]:
    return ["--config", str(REPO / "configs" / "digits" / "baseline.yaml"), "--out", str(out), "tracking=none",
            "train.epochs=1", "--grid", grid]


def test_a_failed_run_means_no_best_setting_and_exit_2(tmp_path, capsys):
    from mtl_cog.cli import sweep

    out = tmp_path / "sweep"
    args = sweep_args(out, "model.backbone=cog_cnn_tiny,no_such_backbone")
    cfg = load_config(REPO / "configs" / "digits" / "baseline.yaml",
                      ["tracking=none", "train.epochs=1", "model.backbone=cog_cnn_tiny", f"output_dir={out}",
                       "run_name=run_00"])
    fake_finished_run(out / "run_00", cfg)
    (out / "best_config.yaml").write_text("stale: true\n")  # from an earlier state of the folder
    with pytest.raises(UserError, match="1 of 2 runs failed .*no best setting was chosen.*--resume"):
        sweep.main(args)
    assert not (out / "best_config.yaml").exists()
    table = pd.read_csv(out / "sweep.csv")
    assert table["status"][0] == "ok" and table["status"][1].startswith("failed (exit 2")
    assert table["chosen"].isna().all()
    assert "2 planned (0 in the bundle, 1 finished outside it, 0 to resume, 1 to train)" in capsys.readouterr().out
    assert "no_such_backbone" in (out / "run_01.log").read_text()


def test_an_unfinished_run_is_resumed_not_restarted(tmp_path):
    from mtl_cog.cli import sweep
    from mtl_cog.experiments.sweep import UNFINISHED

    out = tmp_path / "sweep"
    args = sweep.parse_args(sweep_args(out, "optim.follower_lr=1e-3,2e-3"))
    from mtl_cog.experiments import campaign

    plan, _ = sweep.campaign_of(args, out)
    planned = campaign.plan(plan)
    (out / "run_01").mkdir(parents=True)
    save_config(planned[1].config, out / "run_01" / rundir.CONFIG)  # killed before its first epoch ended
    planned = campaign.plan(plan)
    assert [p.state for p in planned] == ["new", UNFINISHED]
    job = campaign.jobs(planned, ())[1][1]
    assert job.command[-2:] == ("--resume", str(out / "run_01"))
    assert "--config" in campaign.jobs(planned, ())[0][1].command


def test_resume_needs_a_sweep_folder_and_no_new_settings(tmp_path):
    from mtl_cog.cli import sweep

    with pytest.raises(UserError, match="sweep_args.json"):
        sweep.parse_args(["--resume", str(tmp_path)])
    with pytest.raises(UserError, match="give none"):
        sweep.parse_args(["--resume", str(tmp_path), "--grid", "optim.follower_lr=1,2"])


def test_sweep_dry_run_lists_runs_and_time_and_writes_nothing(tmp_path, capsys):
    from mtl_cog.cli import sweep

    out = tmp_path / "sweep"
    sweep.main([*sweep_args(out, "optim.follower_lr=1e-3,2e-3,4e-3"), "--dry-run"])
    text = capsys.readouterr().out
    assert text.count(" new ") == 3
    assert "3 planned (0 in the bundle, 0 finished outside it, 0 to resume, 3 to train)" in text
    assert "estimated: " in text and "core-hours" in text
    assert not out.exists()


@pytest.mark.slow
def test_submitit_sweep_from_the_users_folder_then_interrupted_and_resumed(tiny_overrides, tmp_path, monkeypatch,
                                                                          submitit_local):
    """A real sweep through submitit's local executor, run from a folder outside the clone with
    relative paths; a second sweep is interrupted with Ctrl-C (SIGINT to its process group) and
    finished with --resume, which continues the interrupted run from its saved state."""
    from mtl_cog.cli import sweep

    monkeypatch.chdir(tmp_path)
    overrides = [o for o in tiny_overrides if not o.startswith("output_dir")] + ["train.epochs=1"]
    config = str(REPO / "configs" / "synthetic" / "cog_ts.yaml")
    best = sweep.main(["--config", config, *overrides, "--out", "sweeps/a", "--grid", "optim.leader_lr=1e-5,1e-4"],
                      executor=submitit_local)
    assert best == Path("sweeps/a/best_config.yaml") and (tmp_path / best).is_file()  # relative to the user's folder
    assert (tmp_path / "sweeps" / "a" / "run_01" / rundir.DONE).is_file()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    many_epochs = [o for o in overrides if not o.startswith("train.epochs")] + ["train.epochs=30"]
    command = [sys.executable, "-m", "mtl_cog.cli.sweep", "--config", config, *many_epochs, "--out", "sweeps/b",
               "--grid", "optim.leader_lr=1e-5"]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "sweeps" / "b" / "run_00" / rundir.METRICS
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    assert metrics.is_file(), process.communicate()[0]
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole process group
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "--resume sweeps/b" in output, output
    assert not (tmp_path / "sweeps" / "b" / "run_00" / rundir.DONE).exists()
    finished = subprocess.run([sys.executable, "-m", "mtl_cog.cli.sweep", "--resume", "sweeps/b"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "(0 in the bundle, 0 finished outside it, 1 to resume, 0 to train)" in finished.stdout
    assert "resumed at epoch" in (tmp_path / "sweeps" / "b" / "run_00.log").read_text()
    assert (tmp_path / "sweeps" / "b" / "best_config.yaml").is_file()


def test_slurm_options_become_the_sbatch_header(tmp_path, monkeypatch):
    import argparse
    import shutil

    from mtl_cog.experiments import launcher

    parser = argparse.ArgumentParser()
    launcher.add_launcher_arguments(parser)
    args = parser.parse_args(["--launcher", "slurm", "--partition", "gpu", "--gpus-per-run", "2", "--time-limit", "90",
                              "--slurm-setup", "module load cuda", "--slurm-args", "account=proj", "qos=high"])
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="sbatch"):
        launcher.slurm_executor(args, tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    header = launcher.slurm_executor(args, tmp_path)._executor._make_submission_file_text("python -m x", "uid")
    for line in ("--partition=gpu", "--gpus-per-node=2", "--ntasks-per-node=1", "--time=90", "--account=proj",
                 "--qos=high", "--job-name=mtl_cog", "--cpus-per-task=6", "--mem=16GB"):
        assert f"#SBATCH {line}" in header, line
    assert "module load cuda" in header
    with pytest.raises(UserError, match="key=value"):
        launcher.slurm_executor(parser.parse_args(["--launcher", "slurm", "--slurm-args", "account"]), tmp_path)
