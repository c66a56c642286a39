"""The installed ``mtl-cog`` command dispatches to the same ``main`` functions as ``scripts/*.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtl_cog.cli import main as dispatcher

REPO = Path(__file__).resolve().parents[1]


def test_every_script_is_a_command_and_every_command_has_a_script():
    # audit_claims is no command on purpose: an independent audit that must not import mtl_cog
    scripts = {p.stem.replace("_", "-") for p in (REPO / "scripts").glob("*.py")} - {"train-mtl", "audit-claims"}
    assert scripts | {"train"} == set(dispatcher.COMMANDS)


def test_help_lists_the_commands(capsys):
    dispatcher.main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in dispatcher.COMMANDS)


def test_unknown_command_is_one_error_line():
    mtl_cog = shutil.which("mtl-cog", path=str(Path(sys.executable).parent))
    if mtl_cog is None:
        pytest.skip("mtl-cog is not installed in this environment (pip install -e .)")
    result = subprocess.run([mtl_cog, "trian"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "unknown command 'trian'" in result.stderr


def test_a_command_runs_through_the_dispatcher(tmp_path):
    metrics = dispatcher.main(["parameter-counts", "--dataset", "digits", "--classes", "10"])
    assert "| cog_ts |" in metrics
