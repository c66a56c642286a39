"""``mtl-cog --help`` and ``--version`` answer at once: no command module (torch, timm, W&B, plots) is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "timm", "wandb", "matplotlib", "pandas", "accelerate")

PROBE = """
import json, sys
from mtl_cog.cli.main import main
main(sys.argv[1:])
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _probe(*argv: str) -> tuple[list[str], list[str]]:
    """(the lines printed, the heavy modules imported) of ``mtl-cog *argv`` in a fresh interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    return lines[:-1], json.loads(lines[-1])


def test_help_lists_every_command_without_importing_any():
    lines, imported = _probe("--help")
    assert imported == []
    for name in ("train", "evaluate", "compare", "reproduce", "leader-curve", "report"):
        assert any(line.split()[:1] == [name] for line in lines), name


def test_version_is_the_packages():
    lines, imported = _probe("--version")
    assert lines == [f"mtl-cog {version('mtl_cog')}"] and imported == []


def test_a_chosen_command_is_imported_and_runs():
    lines, imported = _probe("parameter-counts", "--dataset", "digits", "--classes", "10")
    assert "torch" in imported and any("| cog_ts |" in line for line in lines)
