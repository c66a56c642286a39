"""W&B stays on but quiet: a tracked run prints one line about W&B (where its data went), not W&B's thirty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_offline import offline_runs

REPO = Path(__file__).resolve().parents[1]

# A Tracker as fit uses it (two epochs, the summary, finish), printing nothing of its own.
TRACKER_SCRIPT = """
import sys
from pathlib import Path
from mtl_cog.runs.tracking import Tracker, log_with
from mtl_cog.training.accelerator import create_accelerator
run_dir = Path(sys.argv[1])
run_dir.mkdir(parents=True, exist_ok=True)
tracker = Tracker(create_accelerator(log_with("wandb")), run_dir, "mtl_cog-test", "net", {"seed": 0})
for epoch in (1, 2):
    tracker.log_epoch(epoch, {"x": epoch}, {"a/val/nll": 1.0 / epoch})
tracker.log_final({"epoch": 3, "final": True}, {"a/test/nll": 0.25})
tracker.finish()
"""


def _run(tmp_path: Path, **extra: str) -> tuple[list[str], Path]:
    # no credentials (HOME without ~/.netrc, no API key) and no WANDB_MODE: the run goes offline on its own;
    # no WANDB_SILENT/WANDB_QUIET: the defaults a user gets
    drop = ("WANDB_SERVICE", "WANDB_MODE", "WANDB_SILENT", "WANDB_QUIET", "WANDB_API_KEY")
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), **extra}
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", TRACKER_SCRIPT, str(run_dir)], env=env, capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return (result.stdout + result.stderr).splitlines(), run_dir


def test_an_offline_run_prints_one_line_about_wandb_and_still_records_every_row(tmp_path):
    lines, run_dir = _run(tmp_path)
    about_wandb = [line for line in lines if "wandb" in line.lower() or "W&B" in line]
    assert len(about_wandb) == 1, lines
    assert about_wandb[0].startswith("W&B offline (no W&B credentials") and "wandb sync" in about_wandb[0]
    (run,) = offline_runs(run_dir)  # still tracked: the rows and the summary are on disk for `wandb sync`
    assert run.steps == [1, 2] and run.summary["a/test/nll"] == 0.25


@pytest.mark.slow  # a second W&B start (about 30 s on 2 busy cores)
def test_wandb_silent_false_gives_back_wandbs_own_output(tmp_path):
    lines, _ = _run(tmp_path, WANDB_SILENT="false")
    assert sum(line.startswith("wandb:") for line in lines) > 5, lines
