"""Two "machines" on this host: Accelerate's multi-machine options (``--num_machines 2 --machine_rank 0|1
--main_process_ip 127.0.0.1``, gloo), one process per machine, through ``mtl-cog launch``.

A run trains and evaluates to the same numbers, bit for bit, as the same run with two processes on
one machine (same ranks, same shards, same gloo reductions); the death of either machine's process
ends both launches with one ``error:`` line each and a run folder that ``--resume`` finishes; a
machine that stops answering without closing its connections is given up after
``train.dist_timeout_s`` (docs/guides/failure_paths.md, docs/guides/cluster.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_resume import _assert_same_results, _saved_progress

from mtl_cog.runs import rundir

REPO = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "mtl_cog.cli.launch", "--config_file",
          str(REPO / "configs" / "accelerate" / "multi_process.yaml"), "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # the same float sums in every run
EPOCHS = 2
TINY = ["tracking=none", f"train.epochs={EPOCHS}", "train.batch_size=32", "train.eval_batch_size=64",
        "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=3", "data.synthetic.train_size=96",
        "data.synthetic.val_size=40", "data.synthetic.test_size=37"]  # 37: one shard is padded at evaluation
# long enough to be killed in the middle: 20 epochs of 10 steps, a saved state every 3 steps
LONG = ["tracking=none", "train.epochs=20", "train.batch_size=32", "model.backbone=cog_cnn_tiny",
        "data.synthetic.num_attributes=3", "data.synthetic.train_size=320", "data.synthetic.val_size=40",
        "data.synthetic.test_size=37", "train.save_every_steps=3"]


def free_port() -> int:
    """A port nothing listens on now (both machines must be given the same one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_machines(run: Path, overrides: list[str], ranks: tuple[int, ...] = (0, 1),
                   launch: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """Machine 0 and machine 1 (or those of ``ranks``): one launch each, one process each, meeting at
    127.0.0.1:<free port>; ``launch``: more launcher options."""
    port = str(free_port())
    return [subprocess.Popen([*LAUNCH, "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                              "--main_process_ip", "127.0.0.1", "--main_process_port", port, *launch,
                              str(REPO / "scripts" / "train_mtl.py"), *overrides, f"output_dir={run.parent}",
                              f"run_name={run.name}"],
                             cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in ranks]


def finish(machines: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each machine; a machine still running after ``timeout`` s is a hang."""
    results = []
    deadline = time.monotonic() + timeout
    try:
        for machine in machines:
            out, err = machine.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((machine.returncode, out, err))
    finally:
        for machine in machines:
            if machine.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    for process in machine_tree(machine):
                        process.kill()
                machine.wait()
    return results


def machine_tree(machine: subprocess.Popen) -> list[psutil.Process]:
    """A machine's launch and every process under it (torchrun starts its workers in sessions of their own, so
    the launch's process group does not hold them)."""
    launch = psutil.Process(machine.pid)
    return [launch, *launch.children(recursive=True)]


def worker(machine: subprocess.Popen) -> psutil.Process:
    """The training process a machine's launch started."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in machine_tree(machine)[1:] if "train_mtl" in " ".join(p.cmdline())]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError("the machine's launch started no training process")


def wait_for_training(run: Path, machines: list[subprocess.Popen]) -> None:
    """Until the run has written its first epoch's metrics line and a saved state (both machines still up)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and all(m.poll() is None for m in machines):
        if (run / rundir.METRICS).exists() and (run / rundir.STATE).exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"the run did not start training: {[m.poll() for m in machines]}")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.slow
def test_two_machines_train_and_evaluate_to_the_numbers_of_two_processes_on_one(tmp_path):
    one = subprocess.run([*LAUNCH, "--main_process_port", str(free_port()), str(REPO / "scripts" / "train_mtl.py"),
                          *TINY, f"output_dir={tmp_path}", "run_name=one"], cwd=REPO, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    run = tmp_path / "two"
    results = finish(start_machines(run, TINY), timeout=600)
    for code, out, err in results:
        assert code == 0 and "Traceback" not in err, err[-3000:]
        assert "test metrics" in out  # each machine's first process prints the (gathered) results
    assert (run / rundir.DONE).exists() and not list(run.glob("*.tmp*"))
    _assert_same_results(run, tmp_path / "one", EPOCHS)  # every number, bit for bit


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_killing_either_machines_process_ends_both_with_one_error_line_and_resumes(tmp_path, victim):
    run = tmp_path / "two"
    machines = start_machines(run, LONG)
    wait_for_training(run, machines)
    worker(machines[victim]).send_signal(signal.SIGKILL)
    results = finish(machines, timeout=120)
    for rank, (code, _, err) in enumerate(results):
        assert code == 2 and "Traceback" not in err and "ChildFailedError" not in err, (rank, err[-3000:])
        assert len(error_lines(err)) == 1, (rank, err[-3000:])
    assert error_lines(results[victim][2])[0].startswith(f"error: process {victim} ")  # named, with its signal
    assert "SIGKILL" in results[victim][2] and "--resume" in results[victim][2]
    assert "another process of this 2-process launch stopped" in results[1 - victim][2]
    assert not (run / rundir.DONE).exists()
    saved = _saved_progress(run)
    # resumed on one machine (any process count resumes); one epoch past the saved one keeps the test short
    resumed = subprocess.run([*LAUNCH, "--main_process_port", str(free_port()), str(REPO / "scripts" / "train_mtl.py"),
                              "--resume", str(run), f"train.epochs={saved.epoch + 1}"], cwd=REPO, env=ENV,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at epoch {saved.epoch}, step {saved.within.step}" in resumed.stdout
    assert (run / rundir.DONE).exists()


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "stops_answering"])
def test_a_machine_that_dies_or_stops_answering_ends_the_other_with_one_error_line(tmp_path, victim, how):
    """The whole machine at once: its launch and its process. Killed, its connections close and the other
    machine's process notices at once; stopped (a hung machine, or one that lost power or its network), they
    stay open and the other gives up after train.dist_timeout_s instead of waiting for ever."""
    run = tmp_path / "two"
    timeout_s = 15
    machines = start_machines(run, [*LONG, f"train.dist_timeout_s={timeout_s}"])
    wait_for_training(run, machines)
    tree = machine_tree(machines[victim])
    started = time.monotonic()
    for process in tree:
        process.send_signal(how)
    try:
        [(code, _, err)] = finish([machines[1 - victim]], timeout=timeout_s + 90)
        waited = time.monotonic() - started
    finally:
        for process in tree:  # a stopped machine is ended here, SIGKILL needs no SIGCONT
            if process.is_running():
                process.send_signal(signal.SIGKILL)
        machines[victim].wait()
    assert code == 2 and "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
    if how == signal.SIGKILL:
        assert waited < timeout_s and "another process of this 2-process launch stopped" in err, (waited, err)
        assert "The launch on that process's machine names the process" in err
    else:
        assert timeout_s <= waited and "did not answer within train.dist_timeout_s" in err, (waited, err)
    assert (run / rundir.STATE).exists() and not (run / rundir.DONE).exists()


@pytest.mark.slow
def test_cpu_flag_with_two_machines_is_refused_on_each_machine_before_writing(tmp_path):
    """``--cpu`` sends Accelerate to its simple launcher, which connects nothing without mpirun: each machine's
    process would train alone on all the data. Each launch says so in one line and writes nothing."""
    port = str(free_port())
    cpu = [sys.executable, "-m", "mtl_cog.cli.launch", "--cpu", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--quiet", "--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
           "--main_process_port", port]
    machines = [subprocess.Popen([*cpu, "--machine_rank", str(rank), str(REPO / "scripts" / "train_mtl.py"), *TINY,
                                  f"output_dir={tmp_path}", "run_name=two"], cwd=REPO, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    for code, _, err in finish(machines, timeout=300):
        assert code == 2 and "Traceback" not in err, err[-3000:]
        assert len(error_lines(err)) == 1 and "started this process on its own" in err, err[-3000:]
    assert not (tmp_path / "two").exists()


@pytest.mark.slow
@pytest.mark.parametrize("alone", [0, 1])
def test_a_machine_whose_partner_never_starts_ends_with_one_error_line(tmp_path, alone):
    """Machine 0 waits for the others to join, machine 1 for machine 0 to answer: both give up after the
    rendezvous timeout (--rdzv_conf timeout=, 600 s by default) with one line saying what to check."""
    [(code, _, err)] = finish(start_machines(tmp_path / "two", TINY, ranks=(alone,),
                                             launch=("--rdzv_conf", "timeout=5")), timeout=120)
    assert code == 2 and "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
    assert "the 2 machines of this launch did not meet at 127.0.0.1:" in err and "--machine_rank" in err
    assert not (tmp_path / "two").exists()
