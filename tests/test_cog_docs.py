"""docs/guides/cog_in_your_loop.md runs as written: each section's files and commands, in a fresh folder.

Every ```python block with a ``title="name.py"`` is written to that file; a section's ```bash blocks then run
with ``bash -eu`` and must succeed, and the lines of its ```text output that hold no measured number must
appear in what they printed. ``torch.compile``'s default backend generates C++ for a minute on 2 busy
cores, so the fast test compiles with ``backend="eager"`` (dynamo still traces the calibrated model);
the slow one runs the page verbatim.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "guides" / "cog_in_your_loop.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
MEASURED = re.compile(r"\d\.\d")  # a loss, a temperature, a rate: what a run measures is not compared
COMPILED, FAST_COMPILED = "torch.compile(model)", 'torch.compile(model, backend="eager")'
SECTIONS = ("Plain PyTorch", "The same under `accelerate launch`", "One task, COG-TS")


def section(title: str) -> str:
    parts = re.split(r"^## ", PAGE.read_text(), flags=re.M)
    [found] = [part for part in parts if part.startswith(title)]
    return found


def run_section(title: str, tmp_path: Path, fast: bool) -> None:
    for lang, info, body in FENCE.findall(PAGE.read_text()):
        name = re.search(r'title="([^"]+)"', info)
        if lang == "python":
            assert name, f"a python block without title=\"file.py\" in {PAGE.name}: it would never run"
            (tmp_path / name.group(1)).write_text(body.replace(COMPILED, FAST_COMPILED) if fast else body)
    found = FENCE.findall(section(title))
    script = "\n".join(body for lang, _, body in found if lang == "bash")
    assert script, title
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-eu", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    shown = [" ".join(line.split()) for lang, _, body in found if lang == "text" for line in body.splitlines()
             if line.strip() and not MEASURED.search(line)]
    assert [line for line in shown if line not in output] == []


def test_the_page_has_three_examples_each_with_commands():
    assert PAGE.read_text().count(COMPILED) == 1  # the fast test's replacement still applies
    for title in SECTIONS:
        assert "```bash" in section(title), title


def test_the_reference_and_the_nav_list_the_page_and_the_module():
    api = (REPO / "docs" / "reference" / "api.md").read_text()
    assert "::: mtl_cog.cog\n" in api and "::: mtl_cog.cog.parameter_groups" in api
    nav = (REPO / "mkdocs.yml").read_text()
    assert "- guides/python_api.md\n      - guides/cog_in_your_loop.md\n" in nav
    assert "mtl_cog.cog" in (REPO / "README.md").read_text().split("## What it is")[1].split("\n## ")[0]


@pytest.mark.parametrize("title", SECTIONS)
def test_each_example_runs(title, tmp_path):
    run_section(title, tmp_path, fast=True)


@pytest.mark.slow
def test_the_compiled_example_runs_verbatim(tmp_path):
    run_section(SECTIONS[2], tmp_path, fast=False)
