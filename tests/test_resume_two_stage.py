"""TST's second stage runs in the same loop as stage one, so a run killed in stage two resumes bit-exactly too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from mtl_cog.errors import CheckpointError
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as state
from mtl_cog.runs.checkpoint import read_metadata

REPO = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "mtl_cog.cli.train", "--config", str(REPO / "configs" / "synthetic" / "tst.yaml"),
       "tracking=none", "train.epochs=2", "train.batch_size=32", "train.eval_batch_size=64",
       "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=4", "data.synthetic.train_size=320",
       "data.synthetic.val_size=64", "data.synthetic.test_size=40", "two_stage.epochs=6", "two_stage.latent_dim=8",
       "train.save_every_steps=3"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _stage_two_progress(run: Path) -> state.Progress | None:
    path = run / rundir.STAGE_TWO_STATE
    try:
        return state.Progress.from_dict(json.loads(read_metadata(path)["progress"])) if path.exists() else None
    except CheckpointError:  # caught between the writer's two opens
        return None


@pytest.mark.slow
def test_kill_in_stage_two_then_resume_equals_uninterrupted_run(tmp_path):
    reference, killed = tmp_path / "ref", tmp_path / "killed"
    subprocess.run([*RUN, f"output_dir={tmp_path}", "run_name=ref"], cwd=REPO, env=ENV, check=True,
                   capture_output=True, timeout=600)
    proc = subprocess.Popen([*RUN, f"output_dir={tmp_path}", "run_name=killed"], cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        progress = _stage_two_progress(killed)
        if progress is not None and progress.epoch >= 3:
            psutil.Process(proc.pid).send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the test could kill it in stage two"
    result = subprocess.run([*RUN[:3], "--resume", str(killed)], cwd=REPO, env=ENV, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "stage_two: resumed at epoch" in result.stdout
    for name in (rundir.STAGE_TWO_METRICS, rundir.TEST_METRICS, rundir.DONE):
        assert (killed / name).read_text() == (reference / name).read_text(), name
    name = rundir.predictions_file("test")
    with np.load(killed / name) as a, np.load(reference / name) as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
