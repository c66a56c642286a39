"""Every failure path safe: nothing lost, nothing silently wrong, no traceback (docs/guides/failure_paths.md).

Grouped by the families of docs/guides/failure_paths.md. Each case goes through a real entry point
(``mtl_cog.cli.<command>.main`` under ``run_cli``, exactly what ``python scripts/<command>.py``
runs) or a real subprocess where the launcher, a signal or a resource limit is the point. The
single-line bad-input cases of the same families are in the tables of ``test_robustness.py``.
It stays one file over 450 lines because it mirrors docs/guides/failure_paths.md family by family, so that
a reader checks the document against one file.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from test_robustness import REPO, script, tiny, user_error

from mtl_cog.errors import PeerLostError, run_cli
from mtl_cog.io import append_jsonl, atomic_write_text, is_temp_file_name
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as state
from mtl_cog.runs.digests import record_digests

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
SINGLE = ["--config_file", str(REPO / "configs" / "accelerate" / "default.yaml"), "--quiet"]
MULTI = ["--config_file", str(REPO / "configs" / "accelerate" / "multi_process.yaml"), "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished tiny run (2 epochs), copied by the tests that need a run folder."""
    tmp = tmp_path_factory.mktemp("finished")
    return script("train_mtl").main(tiny(tmp, "run_name=r", "train.epochs=2"))


def copy_run(run: Path, tmp: Path, done: bool = True) -> Path:
    """A copy of ``run`` under ``tmp/runs/r``; ``done=False``: as if killed after its last epoch."""
    target = tmp / "runs" / "r"
    shutil.copytree(run, target)
    if not done:
        (target / rundir.DONE).unlink()
    return target


def folder_listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ run folders


def test_overwrite_refuses_a_run_folder_with_other_files_and_deletes_nothing(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    (run / "notes.txt").write_text("my notes")
    before = folder_listing(run)
    err = user_error("train_mtl", [*tiny(tmp_path, "run_name=r"), "--overwrite"], capsys)
    assert "also holds files that no run writes (notes.txt)" in err and "nothing was deleted" in err
    assert folder_listing(run) == before


def test_overwrite_refuses_a_folder_that_merely_holds_a_config_yaml(finished, tmp_path, capsys):
    folder = tmp_path / "runs" / "r"
    folder.mkdir(parents=True)
    shutil.copy(finished / rundir.CONFIG, folder / rundir.CONFIG)
    (folder / "thesis.tex").write_text("years of work")
    err = user_error("train_mtl", [*tiny(tmp_path, "run_name=r"), "--overwrite"], capsys)
    assert "is not an mtl_cog run folder (no valid mtl_cog_run.json)" in err
    assert (folder / "thesis.tex").read_text() == "years of work" and (folder / rundir.CONFIG).exists()


def test_overwrite_keeps_the_old_run_until_the_new_one_starts(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    before = folder_listing(run)
    err = user_error("train_mtl", [*tiny(tmp_path, "run_name=r", "data.task=celeba", f"data.root={tmp_path}"),
                                   "--overwrite"], capsys)
    assert "CelebA not found" in err
    assert folder_listing(run) == before  # bad data: the run that would have been replaced is intact


def test_overwrite_replaces_a_run_folder(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    (run / ".best_model.safetensors.ab12cd34.tmp").write_bytes(b"left by a killed write")
    script("train_mtl").main([*tiny(tmp_path, "run_name=r", "train.epochs=1"), "--overwrite"])
    assert (run / rundir.DONE).read_text() == "best_epoch=1\n"
    assert [json.loads(line)["epoch"] for line in (run / rundir.METRICS).read_text().splitlines()] == [1, 2]
    assert not any(is_temp_file_name(p.name) for p in run.iterdir()) and not (run / rundir.LOCK).exists()


def _holding_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _write_lock(run: Path, pid: int, host: str | None = None) -> None:
    created = psutil.Process(pid).create_time() if psutil.pid_exists(pid) else 0.0
    (run / rundir.LOCK).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                               "started": "2026-01-01T00:00:00", "process_started": created,
                                               "token": "t"}))


def test_a_second_writer_is_refused_with_the_holders_pid_and_a_stale_lock_is_taken_over(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path, done=False)
    holder = _holding_process()
    try:
        _write_lock(run, holder.pid)
        err = user_error("train_mtl", ["--resume", str(run)], capsys)
        assert f"is in use by another run: process {holder.pid} on {socket.gethostname()}" in err
        err = user_error("train_mtl", [*tiny(tmp_path, "run_name=r"), "--overwrite"], capsys)
        assert f"in use by a run in progress: process {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    assert not (run / rundir.DONE).exists()
    script("train_mtl").main(["--resume", str(run)])  # the holder is gone: its lock is stale, taken over
    assert "taking over the lock of process" in capsys.readouterr().err
    assert (run / rundir.DONE).exists() and not (run / rundir.LOCK).exists()
    assert (run / rundir.METRICS).read_text() == (finished / rundir.METRICS).read_text()


def test_a_lock_from_another_host_is_refused_naming_the_file(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path, done=False)
    _write_lock(run, 1, host="gpu-node-17")
    err = user_error("train_mtl", ["--resume", str(run)], capsys)
    assert "process 1 on gpu-node-17" in err and "another machine" in err and f"delete {run / rundir.LOCK}" in err


@pytest.mark.slow
def test_resume_of_a_run_still_training_is_refused_then_continues_after_a_kill(tmp_path, capsys):
    """Real processes: a training run holds its lock; --resume beside it is refused; after SIGKILL it resumes."""
    run = tmp_path / "runs" / "live"
    argv = tiny(tmp_path, "run_name=live", "train.epochs=8", "data.synthetic.train_size=256")
    proc = subprocess.Popen([sys.executable, "scripts/train_mtl.py", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run / rundir.METRICS).exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before the test could see it"
        err = user_error("train_mtl", ["--resume", str(run)], capsys)
        assert f"is in use by another run: process {proc.pid}" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    result = script("train_mtl").main(["--resume", str(run)])
    epochs = [json.loads(line)["epoch"] for line in (result / rundir.METRICS).read_text().splitlines()]
    assert epochs == sorted(set(epochs)) and (result / rundir.DONE).exists()  # one writer: no epoch twice


# ------------------------------------------------------------------------------ the launcher


def _accelerate(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*ACCELERATE, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_accelerate_launch_user_error_is_one_line_without_launcher_warnings():
    result = _accelerate(*SINGLE, "scripts/train_mtl.py", "train.epochs=zero")
    assert result.stderr.strip() == "error: train.epochs must be an integer. Got 'zero'.", result.stderr
    assert result.returncode == 1  # the launcher's own code for any failure of its child (see the config file)


def test_readme_launch_lines_name_a_shipped_config_and_quiet():
    top = (REPO / "README.md").read_text()
    guide = (REPO / "docs" / "guides" / "training.md").read_text()
    running = guide.split("## Running")[1].split("\n## ")[0]
    lines = [line for line in (top + running).splitlines() if "accelerate launch" in line]
    assert len(lines) >= 5
    for line in lines:
        config = line.split("--config_file ")[1].split()[0]
        assert (REPO / config).is_file() and " --quiet " in line, line


@pytest.mark.slow
def test_two_process_user_error_prints_one_error_line():
    result = _accelerate(*MULTI, "scripts/train_mtl.py", "train.epochs=zero")
    errors = [line for line in result.stderr.splitlines() if "error: " in line]
    assert errors == ["error: train.epochs must be an integer. Got 'zero'."], result.stderr[-3000:]
    assert "values were not passed" not in result.stderr and result.returncode == 1


@pytest.mark.slow  # a two-process accelerate launch that trains
def test_killing_one_process_of_two_gives_the_survivor_one_error_line(tmp_path):
    """Real processes: SIGKILL rank 1 of a 2-process (gloo) run; rank 0 ends with one error line, no traceback."""
    run = tmp_path / "runs" / "two"
    argv = tiny(tmp_path, "run_name=two", "train.epochs=50", "data.synthetic.train_size=640")
    proc = subprocess.Popen([*ACCELERATE, *MULTI, "scripts/train_mtl.py", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / rundir.METRICS).exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train_mtl" in " ".join(p.cmdline())]
        victim = next(p for p in workers if p.environ().get("RANK") == "1")
        victim.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "error: another process of this 2-process launch stopped" in stderr, stderr[-3000:]
    assert "[rank0]: Traceback" not in stderr and "gloo" in stderr  # the cause is named, in one line
    assert proc.returncode == 1 and (run / rundir.STATE).exists()  # the last saved state is there to resume


def test_lost_peer_is_one_error_line_and_other_failures_keep_their_traceback(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: (_ for _ in ()).throw(RuntimeError("[gloo/pair.cc:534] Connection closed by peer [::1]:1")))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: another process of this 2-process launch stopped") and err.count("\n") == 1
    with pytest.raises(RuntimeError, match="a bug"):  # anything else is a bug and stays visible
        run_cli(lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    assert isinstance(PeerLostError("x"), RuntimeError)


def test_a_peer_that_does_not_answer_in_time_is_one_error_line_naming_the_timeout(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one process on each of two machines
    timeout = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete"
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: (_ for _ in ()).throw(RuntimeError(timeout)))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Timed out waiting 20000ms" in err
    assert "did not answer within train.dist_timeout_s" in err and "--resume RUN_DIR" in err
    with pytest.raises(SystemExit):
        run_cli(lambda: (_ for _ in ()).throw(RuntimeError("[gloo/pair.cc:534] Connection reset by peer")))
    assert "The launch on that process's machine names the process that failed first" in capsys.readouterr().err


def test_a_cpu_launch_of_several_unconnected_processes_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    # what `accelerate launch --cpu --num_machines 2 ...` (its simple launcher, no mpirun) gives each process
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    err = user_error("train_mtl", tiny(tmp_path, "run_name=r"), capsys)
    assert "started this process on its own" in err and "Leave out --cpu" in err
    assert not (tmp_path / "runs").exists()  # refused before the run folder
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")  # under mpirun the processes know of each other
    from mtl_cog.training.accelerator import check_processes_connected
    check_processes_connected()


def test_a_non_main_process_still_reports_an_error_only_it_hit(monkeypatch, capsys):
    import mtl_cog.errors as errors

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(errors, "NON_MAIN_GRACE_S", 0.01)
    with pytest.raises(SystemExit):
        run_cli(lambda: (_ for _ in ()).throw(errors.DataError("only here")))
    assert capsys.readouterr().err == "error: only here\n"
    monkeypatch.setenv("LOCAL_RANK", "1")  # before the processes connect: the same error on every one of them,
    with pytest.raises(SystemExit) as info:  # printed by the machine's first process only
        run_cli(lambda: (_ for _ in ()).throw(errors.ConfigError("everywhere")))
    assert info.value.code == 2 and capsys.readouterr().err == ""


# ------------------------------------------------------------------------------ storage


def test_read_only_output_dir_and_out(read_only_folder, tmp_path, capsys):
    err = user_error("train_mtl", tiny(tmp_path, f"output_dir={read_only_folder / 'runs'}"), capsys)
    assert f"output_dir {read_only_folder / 'runs'}: {read_only_folder} is not writable" in err
    predictions = tmp_path / "p.npz"
    _small_prediction_file(predictions)
    err = user_error("evaluate", ["--predictions", str(predictions), "--out", str(read_only_folder / "m.json")], capsys)
    assert f"--out {read_only_folder / 'm.json'}: {read_only_folder} is not writable" in err


def _small_prediction_file(path: Path) -> None:
    from mtl_cog.evaluation.predictions import Predictions, save_predictions

    save_predictions(path, Predictions(["a"], [np.array([0.5, -1.0], np.float32)], [np.array([1, 0])]))


def test_full_disk_while_saving_the_state_stops_cleanly_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    import mtl_cog.runs.training_state as training_state

    real_save = training_state.save_file
    calls = []

    def fails_second_time(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:  # epoch 2's state: half written, then the disk is full
            Path(filename).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(training_state, "save_file", fails_second_time)
    err = user_error("train_mtl", tiny(tmp_path, "run_name=r", "train.epochs=3"), capsys)
    run = tmp_path / "runs" / "r"
    assert f"cannot write {run / rundir.STATE}: No space left on device (the disk is full: free some space)" in err
    assert not any(is_temp_file_name(p.name) for p in run.iterdir()) and not (run / rundir.LOCK).exists()
    assert json.loads(safe_open(str(run / rundir.STATE), "pt").metadata()["progress"])["epoch"] == 2  # epoch 1's
    monkeypatch.setattr(training_state, "save_file", real_save)
    script("train_mtl").main(["--resume", str(run)])  # space freed: the run continues from epoch 2
    assert [json.loads(line)["epoch"] for line in (run / rundir.METRICS).read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.slow  # a training in a subprocess (the limit needs its own process)
def test_file_size_limit_during_a_save_is_one_error_line(tmp_path):
    """A real ``ulimit -f`` (EFBIG): the state file (~230 KB) cannot be written; small files can."""
    limit = 150_000

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run([sys.executable, "scripts/train_mtl.py", *tiny(tmp_path, "run_name=r",
                                                                            "data.use_cache=false")],
                            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    run = tmp_path / "runs" / "r"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {run / rundir.STATE}: File too large (the file would exceed the file-size limit "
        "(see `ulimit -f`)).")
    assert not any(is_temp_file_name(p.name) for p in run.iterdir())


def test_a_really_full_disk(tmp_path, capsys):
    """Root only (mounts a 200 KB tmpfs): the same as the simulated cases, from the kernel."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root with permission to mount a small tmpfs")
    try:
        err = user_error("train_mtl", tiny(tmp_path, f"output_dir={disk}", "run_name=r"), capsys)
        assert "No space left on device (the disk is full: free some space)" in err and str(disk / "r") in err
        assert not any(is_temp_file_name(p.name) for p in (disk / "r").iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_every_file_of_a_run_gets_the_umask_mode(finished):
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in finished.iterdir() if p.is_file()}
    assert rundir.BEST_MODEL in modes and rundir.STATE in modes
    assert set(modes.values()) == {0o666 & ~umask}, modes  # safetensors alone would make checkpoints 0600


# ------------------------------------------------------------------------------ checkpoints and states


def _rewrite_state(path: Path, edit) -> None:
    with safe_open(str(path), "pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    edit(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)


def _progress(edit):
    def apply(tensors, metadata):
        progress = json.loads(metadata["progress"])
        edit(progress)
        metadata["progress"] = json.dumps(progress)
    return apply


STATE_DAMAGE = {
    "epoch -5": (_progress(lambda p: p.update(epoch=-5)), "progress epoch = -5 is impossible"),
    "best epoch after the next epoch": (_progress(lambda p: p.update(best_epoch=9)), "best_epoch = 9 is not before"),
    "negative step": (_progress(lambda p: p["within"].update(step=-1)), "within.step = -1 is impossible"),
    "optimiser tensor of the wrong shape": (
        lambda t, m: t.update({"optimizer/0/exp_avg": torch.zeros(3, 3)}),
        "optimiser state 'exp_avg' of parameter 0 has shape (3, 3), but the parameter has shape"),
    "RNG tensor cut short": (lambda t, m: t.update({"rng/torch": t["rng/torch"][:100].clone()}),
                             "RNG state 'rng/torch' is torch.uint8 (100,)"),
    "RNG tensor of another dtype": (lambda t, m: t.update({"rng/torch": t["rng/torch"].float()}),
                                    "RNG state 'rng/torch' is torch.float32"),
    "RNG tensor with damaged content": (lambda t, m: t["rng/torch"].zero_(), "'rng/torch' is damaged"),
    "numpy RNG keys out of range": (lambda t, m: t["rng/numpy_keys"].fill_(-7), "outside numpy's uint32 keys"),
    "NaN weights": (lambda t, m: t["model/heads.linear.weight" if "model/heads.linear.weight" in t else
                                   next(k for k in t if k.startswith("model/") and t[k].is_floating_point())]
                    .fill_(float("nan")), "holds NaN or infinite values"),
}


@pytest.mark.parametrize("case", list(STATE_DAMAGE))
def test_a_damaged_training_state_is_refused_on_resume(case, finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path, done=False)
    edit, expected = STATE_DAMAGE[case]
    _rewrite_state(run / rundir.STATE, edit)
    err = user_error("train_mtl", ["--resume", str(run)], capsys)
    assert str(run / rundir.STATE) in err and expected in err, err
    assert not (run / rundir.LOCK).exists()


def test_nan_weights_in_the_best_checkpoint_are_refused_by_evaluate(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    with safe_open(str(run / rundir.BEST_MODEL), "pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    name = next(k for k in tensors if k.startswith("heads") and tensors[k].is_floating_point())
    tensors[name][0] = float("inf")
    save_file(tensors, str(run / rundir.BEST_MODEL), metadata=metadata)
    record_digests(run)  # as if the run had written it: the loader's own check must refuse it
    err = user_error("evaluate", ["--run", str(run), "--out", str(tmp_path / "m.json")], capsys)
    assert f"{run / rundir.BEST_MODEL} holds NaN or infinite values in 1 tensor(s) ({name})" in err
    assert not (tmp_path / "m.json").exists()


def test_metrics_file_shorter_than_the_state_says_is_refused(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path, done=False)
    lines = (run / rundir.METRICS).read_text().splitlines(keepends=True)
    (run / rundir.METRICS).write_text(lines[0])
    err = user_error("train_mtl", ["--resume", str(run)], capsys)
    assert "has 1 complete lines, but the training state was saved after line 2" in err


# ------------------------------------------------------------------------------ metrics.jsonl


def test_append_jsonl_appends_in_place(tmp_path):
    """O(1): the file is appended to, not rewritten (the same inode, the old bytes untouched)."""
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"epoch": 1})
    inode, first = path.stat().st_ino, path.read_bytes()
    append_jsonl(path, {"epoch": 2, "x": [1.5]})
    assert path.stat().st_ino == inode and path.read_bytes() == first + b'{"epoch": 2, "x": [1.5]}\n'
    assert state.count_lines(path) == 2
    append_jsonl(path, {"epoch": 3})
    assert state.count_lines(path) == 3  # counted incrementally, equal to a full count
    atomic_write_text(path, '{"epoch": 1}\n')  # a rewrite (new inode) starts the count over
    assert state.count_lines(path) == 1


def test_a_kill_in_the_middle_of_an_append_is_repaired_on_resume(finished, tmp_path):
    run = copy_run(finished, tmp_path, done=False)
    with open(run / rundir.METRICS, "ab") as handle:  # what a SIGKILL during the final line's write leaves
        handle.write(b'{"epoch": 3, "final": tr')
    script("train_mtl").main(["--resume", str(run)])
    assert (run / rundir.METRICS).read_bytes() == (finished / rundir.METRICS).read_bytes()


def test_resume_removes_temporary_files_of_killed_writes_only(finished, tmp_path):
    run = copy_run(finished, tmp_path, done=False)
    (run / ".training_state.safetensors.k3j_9xq2.tmp").write_bytes(b"partial")
    (run / ".notes.tmp").write_text("a user's file that only looks similar")
    script("train_mtl").main(["--resume", str(run)])
    assert not (run / ".training_state.safetensors.k3j_9xq2.tmp").exists() and (run / ".notes.tmp").exists()


# ------------------------------------------------------------------------------ reports


def _run_without_predictions(finished: Path, tmp_path: Path) -> Path:
    run = copy_run(finished, tmp_path)
    for split in ("val", "test"):
        (run / rundir.predictions_file(split)).unlink()  # compare then reads test_metrics.csv
    (run / rundir.DIGESTS).unlink()  # as runs from before prediction files (and digests) were
    return run


@pytest.mark.parametrize("cut", ["mid-line", "line boundary", "a task row removed"])
def test_compare_refuses_a_truncated_test_metrics_csv(cut, finished, tmp_path, capsys):
    run = _run_without_predictions(finished, tmp_path)
    path = run / rundir.TEST_METRICS
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    damaged = {"mid-line": text[: len(text) - 40], "line boundary": "".join(lines[:-1]),
               "a task row removed": "".join([lines[0], *lines[2:]])}[cut]
    path.write_text(damaged)
    err = user_error("compare", [str(run), "--out", str(tmp_path / "report")], capsys)
    assert str(path) in err and ("cut short" in err or "incomplete or damaged" in err), err


def test_compare_reads_an_intact_test_metrics_csv(finished, tmp_path):
    run = _run_without_predictions(finished, tmp_path)
    script("compare").main([str(run), "--out", str(tmp_path / "report")])
    assert (tmp_path / "report" / "summary.csv").exists()


def test_compare_refuses_a_yaml_alias_bomb_in_a_run_config(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    bomb = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]\n" for i in range(9))
    (run / rundir.CONFIG).write_text(bomb + (run / rundir.CONFIG).read_text())
    err = user_error("compare", [str(run), "--out", str(tmp_path / "report")], capsys)
    assert "config.yaml is not the file this run wrote" in err  # the digest sees the edit first
    record_digests(run)  # as if the run had written it: the YAML loader's own limit refuses it
    err = user_error("compare", [str(run), "--out", str(tmp_path / "report")], capsys)
    assert "expands to more than 100000 YAML nodes" in err and str(run / rundir.CONFIG) in err


def test_pretrained_weights_offline_are_one_error_line(tmp_path, capsys, monkeypatch):
    """A timm model with weights, none cached, no network (HF_HUB_OFFLINE): refused before any run folder exists."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets (read at import)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # an empty cache
    err = user_error("train_mtl", tiny(tmp_path, "model.backbone=resnet18", "model.pretrained=true"), capsys)
    assert err.startswith("error: model.pretrained=true: the pretrained weights of 'resnet18' could not be fetched")
    assert "set model.pretrained=false" in err and not (tmp_path / "runs").exists()
