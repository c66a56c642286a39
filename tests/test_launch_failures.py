"""``mtl-cog launch`` (``python -m mtl_cog.cli.launch``): a failed multi-process launch ends with one ``error:``
line per failed process and no torchrun traceback, whichever process died (docs/guides/failure_paths.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest
from accelerate.commands import launch as accelerate_launch
from test_robustness import REPO, tiny
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from mtl_cog.cli import launch
from mtl_cog.errors import run_cli
from mtl_cog.runs import rundir

MULTI = ["--config_file", str(REPO / "configs" / "accelerate" / "multi_process.yaml"), "--quiet"]


def _failure(exitcode: int, pid: int) -> ProcessFailure:
    return ProcessFailure(local_rank=0, pid=pid, exitcode=exitcode, error_file="<N/A>")


def test_each_failed_process_gets_one_line_and_a_user_error_is_not_repeated(monkeypatch, capsys):
    failures = {0: _failure(-signal.SIGKILL, 11), 1: _failure(2, 12), 2: _failure(1, 13)}

    def failing(args):
        raise ChildFailedError("scripts/train_mtl.py", failures)

    monkeypatch.setattr(accelerate_launch, "launch_command", failing)
    with pytest.raises(SystemExit) as info:
        launch.main([*MULTI, "--num_processes", "3", "scripts/train_mtl.py"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and "ChildFailedError" not in err
    lines = err.strip().splitlines()
    assert lines == [
        "error: process 0 (pid 11) of this 3-process launch was stopped by signal SIGKILL (killed by hand, or by the "
        "system when out of memory?). A training run keeps its last saved state: continue it with --resume RUN_DIR.",
        "error: process 2 (pid 13) of this 3-process launch ended with exit code 1 (its output above says why). A "
        "training run keeps its last saved state: continue it with --resume RUN_DIR.",
    ]  # process 1 exited with 2: it printed its own error line


def test_processes_the_launcher_stopped_after_a_failure_get_no_line(monkeypatch, capsys):
    """torchrun SIGTERMs the survivors of a failed process; a SIGTERM is a cause only when nothing else failed."""
    launches = iter([{0: _failure(-signal.SIGTERM, 11), 1: _failure(-signal.SIGKILL, 12)},
                     {0: _failure(-signal.SIGTERM, 13)}])

    def failing(args):
        raise ChildFailedError("scripts/train_mtl.py", next(launches))

    monkeypatch.setattr(accelerate_launch, "launch_command", failing)
    for named in ("process 1 (pid 12)", "process 0 (pid 13)"):
        with pytest.raises(SystemExit):
            launch.main([*MULTI, "--num_processes", "2", "scripts/train_mtl.py"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {named} of this 2-process launch"), lines


def test_one_process_launch_keeps_exit_code_2_with_quiet(monkeypatch, capsys):
    """--quiet would make Accelerate's one-process launcher exit 1 whatever the script's code; launch sees it."""
    codes = iter([2, 1])

    def failing(args):
        assert not args.quiet
        raise subprocess.CalledProcessError(next(codes), ["python", "scripts/train_mtl.py"])

    monkeypatch.setattr(accelerate_launch, "launch_command", failing)
    for printed in ("", "error: the launched process ended with exit code 1 (its output above says why).\n"):
        with pytest.raises(SystemExit) as info:
            run_cli(lambda: launch.main(["--quiet", "scripts/train_mtl.py"]))
        assert info.value.code == 2 and capsys.readouterr().err == printed


def test_machines_that_do_not_meet_or_a_busy_port_are_one_line(monkeypatch, capsys):
    from torch.distributed import DistStoreError

    raised = iter([DistStoreError("Timed out after 601 seconds waiting for clients. 1/2 clients joined.\nframe #0"),
                   ConnectionError("Tried to launch distributed communication on port `29500`, but another process "
                                   "is utilizing it."),
                   DistStoreError("one machine meets itself: a bug")])

    def failing(args):
        raise next(raised)

    monkeypatch.setattr(accelerate_launch, "launch_command", failing)
    machines = ["--num_machines", "2", "--num_processes", "2", "--machine_rank", "0", "--main_process_ip", "10.0.0.1",
                "--main_process_port", "29500", "scripts/train_mtl.py"]
    for expected in ("error: the 2 machines of this launch did not meet at 10.0.0.1:29500 (Timed out after 601 "
                     "seconds waiting for clients. 1/2 clients joined.). Start every machine",
                     "error: Tried to launch distributed communication on port `29500`"):
        with pytest.raises(SystemExit) as info:
            run_cli(lambda: launch.main(machines))
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.startswith(expected) and err.count("\n") == 1, err
    with pytest.raises(DistStoreError):
        launch.main(["scripts/train_mtl.py"])


@pytest.mark.slow
@pytest.mark.parametrize("victim_rank", ["0", "1"])
def test_killing_either_process_of_two_ends_with_error_lines_and_no_traceback(tmp_path, victim_rank):
    run = tmp_path / "runs" / "two"
    argv = tiny(tmp_path, "run_name=two", "train.epochs=50", "data.synthetic.train_size=640")
    proc = subprocess.Popen([sys.executable, "-m", "mtl_cog.cli.launch", *MULTI, "scripts/train_mtl.py", *argv],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240
        while not (run / rundir.METRICS).exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train_mtl" in " ".join(p.cmdline())]
        next(p for p in workers if p.environ().get("RANK") == victim_rank).send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert f"error: process {victim_rank} " in stderr and "SIGKILL" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-3000:]
    assert 1 <= len(errors) <= 2 and proc.returncode == 2 and (run / rundir.STATE).exists()
