"""Resuming: a run killed with SIGKILL and resumed finishes with exactly the uninterrupted run's results.

The kill tests start the real entry point in a subprocess, wait until it has saved a training
state (at an epoch boundary, or in the middle of an epoch), SIGKILL it, resume it with
``--resume`` and compare every number of the run folder with an uninterrupted run of the same seed.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from mtl_cog.config import OptimConfig
from mtl_cog.errors import CheckpointError
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as resume
from mtl_cog.runs.checkpoint import read_metadata, save_model
from mtl_cog.runs.training_state import EpochProgress
from mtl_cog.training.optim import build_optimizer, build_scheduler

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "scripts" / "train_mtl.py")]
EPOCHS = 5
# 320 training images in batches of 32: 10 steps per epoch, long enough for the test to catch it
RUN = ["tracking=none", f"train.epochs={EPOCHS}", "train.batch_size=32", "train.eval_batch_size=64",
       "model.backbone=cog_cnn_tiny", "model.drop_rate=0.2", "data.synthetic.num_attributes=5",
       "data.synthetic.train_size=320", "data.synthetic.val_size=50", "data.synthetic.test_size=37",
       "optim.lr_step_epochs=2", "optim.lr_gamma=0.5", "train.save_every_steps=3"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same thread count in every run: same float sums


def _train(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*TRAIN, *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    _train(*RUN, f"output_dir={out}", "run_name=ref")
    return out / "ref"


def _saved_progress(run: Path) -> resume.Progress | None:
    path = run / rundir.STATE
    if not path.exists():
        return None
    try:
        return resume.Progress.from_dict(json.loads(read_metadata(path)["progress"]))
    except CheckpointError:  # safetensors opens the file twice: the writer's rename can fall in between
        return None


def _start_and_kill(run: Path, when, launcher: list[str] = TRAIN, extra: tuple[str, ...] = ()) -> resume.Progress:
    """Start a run, SIGKILL it (and every process it started) as soon as its saved state satisfies ``when``."""
    proc = subprocess.Popen([*launcher, *RUN, *extra, f"output_dir={run.parent}", f"run_name={run.name}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            progress = _saved_progress(run)
            if progress is not None and when(progress):
                # a pre-empted machine: the launcher and all its workers die at once
                for victim in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                    victim.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the test could kill it"
    assert not (run / rundir.DONE).exists()
    return _saved_progress(run)


def _assert_same_results(run: Path, reference: Path, epochs: int = EPOCHS) -> None:
    assert (run / rundir.DONE).read_text() == (reference / rundir.DONE).read_text()
    lines = (run / rundir.METRICS).read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == list(range(1, epochs + 2))  # nothing lost or doubled
    assert lines == (reference / rundir.METRICS).read_text().splitlines()  # every number, bit for bit
    assert (run / rundir.TEST_METRICS).read_text() == (reference / rundir.TEST_METRICS).read_text()
    for split in ("val", "test"):
        name = rundir.predictions_file(split)
        with np.load(run / name) as a, np.load(reference / name) as b:
            assert a.files == b.files
            for key in a.files:
                assert np.array_equal(a[key], b[key]), key


@pytest.mark.slow
def test_kill_at_epoch_boundary_then_resume_equals_uninterrupted_run(reference, tmp_path):
    run = tmp_path / "killed"
    # only epoch-end saves here: the epoch-boundary state stays on disk for a whole epoch, easy to catch
    # (the reference saves every 3 steps too: saving must not change a single number)
    saved = _start_and_kill(run, lambda p: p.epoch >= 3 and p.within.step == 0, extra=("train.save_every_steps=0",))
    assert 3 <= saved.epoch <= EPOCHS + 1
    result = _train("--resume", str(run))
    assert f"resumed at epoch {saved.epoch}, step 0" in result.stdout
    _assert_same_results(run, reference)


@pytest.mark.slow
def test_kill_mid_epoch_then_resume_finishes_with_the_same_results(reference, tmp_path):
    run = tmp_path / "killed"
    saved = _start_and_kill(run, lambda p: p.epoch >= 2 and p.within.step > 0)
    assert saved.within.step > 0
    result = _train("--resume", str(run))
    assert f"resumed at epoch {saved.epoch}, step {saved.within.step}" in result.stdout
    _assert_same_results(run, reference)  # per-step augmentation seeds + saved RNG: exact on the CPU


@pytest.mark.slow
def test_pcgrad_runs_of_one_seed_are_identical_and_a_killed_one_resumes_bit_exactly(tmp_path):
    """PCGrad draws a random task order every step, from its own generator seeded by the run and saved in the
    training state: two runs of one seed agree, and a run killed mid-epoch finishes with their numbers."""
    pcgrad = ("mtl.aggregator=pcgrad",)
    _train(*RUN, *pcgrad, f"output_dir={tmp_path}", "run_name=ref")
    _train(*RUN, *pcgrad, f"output_dir={tmp_path}", "run_name=again")
    _assert_same_results(tmp_path / "again", tmp_path / "ref")
    run = tmp_path / "killed"
    saved = _start_and_kill(run, lambda p: p.epoch >= 2 and p.within.step > 0, extra=pcgrad)
    result = _train("--resume", str(run))
    assert f"resumed at epoch {saved.epoch}, step {saved.within.step}" in result.stdout
    _assert_same_results(run, tmp_path / "ref")


@pytest.mark.slow
def test_two_processes_killed_mid_epoch_then_resumed_equal_uninterrupted_run(tmp_path):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--multi_gpu", "--num_processes", "2", str(REPO / "scripts" / "train_mtl.py")]
    reference = tmp_path / "ref"
    subprocess.run([*launch, *RUN, f"output_dir={tmp_path}", "run_name=ref"], cwd=REPO, env=ENV, check=True,
                   capture_output=True)
    run = tmp_path / "killed"
    saved = _start_and_kill(run, lambda p: p.epoch >= 2 and p.within.step > 0, launcher=launch)
    result = subprocess.run([*launch, "--resume", str(run)], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed at epoch {saved.epoch}, step {saved.within.step}" in result.stdout
    _assert_same_results(run, reference)  # each process continues its own loss sum and augmentation seeds


@pytest.mark.slow
def test_pickled_training_state_is_refused_and_never_runs(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / rundir.DONE).unlink()  # an unfinished run, so --resume loads its state
    marker = tmp_path / "pwned"

    class Payload:  # unpickling this creates `marker`
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = pickle.dumps({"model": Payload()})
    pickle.loads(evil)  # the payload is live: it does create the file ...
    assert marker.exists()
    marker.unlink()
    (run / rundir.STATE).write_bytes(evil)
    result = subprocess.run([*TRAIN, "--resume", str(run)], cwd=REPO, capture_output=True, text=True, env=ENV)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not a valid safetensors file" in result.stderr and "refused unread" in result.stderr
    torch.save({"model": Payload()}, run / rundir.BEST_MODEL)  # torch's zip format: a pickle inside
    (run / rundir.STATE).unlink()
    evaluate = [sys.executable, str(REPO / "scripts" / "evaluate.py"), "--run", str(run), "--out", str(tmp_path / "m"),
                "--unfinished"]  # the run is unfinished: score its checkpoint anyway, so the loader sees the pickle
    result = subprocess.run(evaluate, cwd=REPO, capture_output=True, text=True, env=ENV)
    assert result.returncode == 2 and "refused unread" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()  # ... but mtl_cog never ran it


# ----------------------------------------------------------------- the state file, in process (fast)


class _Net(torch.nn.Module):
    """backbone (with BatchNorm buffers) -> heads: two optimiser groups, as in COG-FC."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width))
        self.heads = torch.nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.backbone(x))


def _parts(seed: int = 0, width: int = 3):
    torch.manual_seed(seed)
    model = _Net(width)
    cfg = OptimConfig(lr_step_epochs=1, lr_gamma=0.5)
    optimizer = build_optimizer(model, ["heads"], cfg)
    return model, optimizer, build_scheduler(optimizer, cfg)


def _train_steps(model, optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_state_roundtrip_restores_everything(tmp_path):
    model, optimizer, scheduler = _parts()
    _train_steps(model, optimizer, 3)
    scheduler.step()
    progress = resume.Progress(4, EpochProgress(7, [1.25], 6, 1), best=0.31, best_epoch=2, metrics_lines=3)
    resume.save_training_state(tmp_path / "s.safetensors", model, optimizer, scheduler, progress)
    expected_next = (torch.rand(3).tolist(), np.random.rand(), random.random())

    model2, optimizer2, scheduler2 = _parts(seed=1)
    torch.manual_seed(99)
    np.random.seed(99)
    loaded = resume.load_training_state(tmp_path / "s.safetensors", model2, optimizer2, scheduler2)
    assert loaded == progress
    assert (torch.rand(3).tolist(), np.random.rand(), random.random()) == expected_next
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    assert [g["lr"] for g in optimizer2.param_groups] == [g["lr"] for g in optimizer.param_groups] == [5e-4, 5e-5]
    assert scheduler2.state_dict() == scheduler.state_dict()
    # both groups' Adam moments: continuing gives identical weights
    torch.manual_seed(5)
    _train_steps(model, optimizer, 2)
    torch.manual_seed(5)
    _train_steps(model2, optimizer2, 2)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_restore_repairs_what_a_kill_between_writes_leaves(tmp_path):
    model, optimizer, scheduler = _parts()
    _train_steps(model, optimizer, 2)
    (tmp_path / rundir.METRICS).write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3}\n')  # line 3: lost epoch
    save_model(tmp_path / rundir.BEST_MODEL, _parts(seed=3)[0], metadata={"epoch": "1"})  # stale best
    progress = resume.Progress(3, EpochProgress(), best=0.2, best_epoch=2, metrics_lines=2)
    resume.save_training_state(tmp_path / rundir.STATE, model, optimizer, scheduler, progress)

    model2, optimizer2, scheduler2 = _parts(seed=1)
    assert resume.restore_run(tmp_path, model2, optimizer2, scheduler2) == progress
    assert (tmp_path / rundir.METRICS).read_text() == '{"epoch": 1}\n{"epoch": 2}\n'
    assert read_metadata(tmp_path / rundir.BEST_MODEL)["epoch"] == "2"  # rebuilt from the state's weights
    from safetensors.torch import load_file

    best = load_file(tmp_path / rundir.BEST_MODEL)
    assert all(torch.equal(best[k], v) for k, v in model.state_dict().items())


def test_restore_refuses_a_state_for_another_model(tmp_path):
    model, optimizer, scheduler = _parts()
    resume.save_training_state(tmp_path / rundir.STATE, model, optimizer, scheduler, resume.Progress(2))
    with pytest.raises(CheckpointError, match="does not match the model"):
        resume.restore_run(tmp_path, *_parts(width=5))


def test_truncated_state_is_a_clear_error(tmp_path):
    model, optimizer, scheduler = _parts()
    path = tmp_path / rundir.STATE
    resume.save_training_state(path, model, optimizer, scheduler, resume.Progress(2))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="refused unread"):
        resume.restore_run(tmp_path, *_parts())
