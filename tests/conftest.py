import os
import subprocess

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Under pytest-xdist (CI: ``-n 2`` on 2 cores) each worker and every process a test starts gets one torch thread:
# two workers of two threads each would share 2 cores four ways.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# Modules whose tests launch several processes that meet on one port (``accelerate launch``'s default 29500, a
# torch.distributed store): under ``--dist loadgroup`` they all run on one worker, one launch at a time.
ONE_PORT = {"test_runs_per_device", "test_robustness", "test_multi_machine", "test_launch_arguments",
            "test_aggregators", "test_launcher", "test_resume", "test_launch_failures", "test_failure_paths"}

# The longest tests start first, so that no worker is left with one of them at the end (the README's tour alone
# takes ~4 minutes on 2 cores): the order of everything else is pytest's.
LONGEST_FIRST = ("test_readme_tour.py::test_the_readme_tour_runs_as_written",
                 "test_gpu_check_cpu.py::test_gpu_check_tiny_runs_every_case_on_the_cpu")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in ONE_PORT:
            item.add_marker(pytest.mark.xdist_group("one_port"))
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("/", 1)[-1], len(rank)))  # stable: the rest keep order


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides that make a training run take seconds on the CPU."""
    return [
        f"output_dir={tmp_path / 'runs'}",
        "tracking=none",
        "train.epochs=2",
        "train.batch_size=32",
        "train.eval_batch_size=64",
        "model.backbone=cog_cnn_tiny",
        "data.synthetic.num_attributes=5",
        "data.synthetic.train_size=96",
        "data.synthetic.val_size=50",
        "data.synthetic.test_size=37",
    ]


@pytest.fixture
def submitit_local(tmp_path):
    """submitit's local executor, standing in for Slurm: the same submission path, jobs run here."""
    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="local")
    executor.update_parameters(timeout_min=20)
    return executor


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state whose mixed precision cannot change once set: start
    and leave each test without one, so tests creating bf16 and fp32 accelerators can share a process."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder no write can go into: chmod for normal users; root ignores modes, so a read-only tmpfs."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("running as root without permission to mount a read-only tmpfs")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def launch_two_processes():
    """Run ``tests/<script>`` under ``accelerate launch`` on two CPU processes (gloo); -> the lines the
    processes printed that start with their rank ("0 ...", "1 ..."), sorted."""
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--multi_gpu", "--num_processes", "2"]

    def run(script: str) -> list[str]:
        result = subprocess.run([*launch, str(repo / "tests" / script)], cwd=repo, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return sorted(line for line in result.stdout.splitlines() if line[:2] in ("0 ", "1 "))

    return run


@pytest.fixture
def in_process(capsys):
    """Run an ``mtl_cog.cli`` module's ``main(argv)`` in this process as its console script runs it (through
    ``errors.run_cli``: a ``UserError`` is one ``error:`` line and exit 2, anything else escapes as the traceback a
    launch would print) -> ``CompletedProcess`` (exit code, stdout, stderr). Each command keeps one real launch in its
    tests (start-up, imports, the entry point); its other cases run here, saving ~3 s of start-up each."""
    from mtl_cog.errors import run_cli

    def run(command, *argv) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        capsys.readouterr()
        try:
            run_cli(lambda: command.main(argv))
            code = 0
        except SystemExit as stop:  # run_cli's exit 2, argparse's usage errors
            code = stop.code if isinstance(stop.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([command.__name__, *argv], code, out, err)

    return run
