"""A setting that would do nothing is refused, and a third-party warning is not printed in a command's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import write_run
from test_robustness import tiny, user_error

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("aggregator", ["equal", "uncertainty"])
def test_aggregate_on_parameters_without_a_gramian_is_refused(aggregator, tmp_path, capsys):
    err = user_error("train_mtl", tiny(tmp_path, f"mtl.aggregator={aggregator}", "mtl.aggregate_on=parameters"), capsys)
    assert "mtl.aggregate_on=parameters has no effect" in err and f"mtl.aggregator={aggregator}" in err
    assert not (tmp_path / "runs").exists()


def test_evaluate_posthoc_isotonic_prints_no_third_party_future_warning(tmp_path):
    run = write_run(tmp_path / "runs", "r", "baseline", 0, n=200)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.evaluate", "--run", str(run), "--posthoc", "isotonic"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "FutureWarning" not in done.stderr and "torch.jit.script" not in done.stderr, done.stderr
