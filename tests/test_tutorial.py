"""docs/tutorials/first_comparison.md runs as written: its ```bash blocks, in order, in a fresh folder.

The tutorial's ``shell`` blocks are the clone, the setup and opening the report in a browser: what the test
environment already is or cannot do. Every ``bash`` block runs with ``bash -eu`` (a failing command fails the test),
then the files the tutorial names must exist and the lines of its shown output that hold no measured number must
appear in what the commands printed. The verbatim run takes several minutes on 2 busy cores, so it is marked slow;
the fast test runs the same blocks on a smaller split for one epoch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorials" / "first_comparison.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
# what the fast test changes: the training split and the epochs (the tutorial must keep using these settings)
FULL_SIZE, FAST_SIZE = "data.max_samples=5000 train.epochs=5", "data.max_samples=300 train.epochs=1"
FILES = ("tutorial/baseline/DONE", "tutorial/cog_ts/DONE", "tutorial/baseline/posthoc_metrics.csv",
         "tutorial/cog_ts/posthoc_metrics.csv", "tutorial/report/report.html")
MEASURED = re.compile(r"\d\.\d|\d+/\d+|\(epoch \d")  # numbers that a run measures or counts: not compared


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def shown_lines(text: str) -> list[str]:
    """The lines of the ```text blocks (the expected output) that hold no measured number, whitespace-normalised."""
    return [" ".join(line.split()) for lang, body in blocks(text) if lang == "text"
            for line in body.splitlines() if line.strip() and line.strip() != "..." and not MEASURED.search(line)]


def run_tutorial(tmp_path: Path, replace: tuple[str, str] | None = None) -> str:
    script = "\n".join(body for lang, body in blocks(TUTORIAL.read_text()) if lang == "bash")
    if replace:
        assert script.count(replace[0]) == 2, f"the tutorial's train commands no longer say {replace[0]!r}"
        script = script.replace(*replace)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(["bash", "-eu", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=3600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    missing = [name for name in FILES if not (tmp_path / name).is_file()]
    assert missing == [], missing
    return output


def test_the_tutorial_is_a_sequence_of_commands_with_their_output():
    found = blocks(TUTORIAL.read_text())
    assert [lang for lang, _ in found].count("bash") >= 4 and shown_lines(TUTORIAL.read_text())
    assert FULL_SIZE in TUTORIAL.read_text()
    assert shown_lines("```text\nepoch   1/5  loss 2.1254\nrun folder: tutorial/x\n...\n```\n") == [
        "run folder: tutorial/x"]


def test_the_tutorial_runs_on_a_smaller_split(tmp_path):
    run_tutorial(tmp_path, (FULL_SIZE, FAST_SIZE))


@pytest.mark.slow
def test_the_tutorial_runs_verbatim_and_prints_what_it_shows(tmp_path):
    output = " ".join(output_line for output_line in run_tutorial(tmp_path).split())
    absent = [line for line in shown_lines(TUTORIAL.read_text()) if line not in output]
    assert absent == []
