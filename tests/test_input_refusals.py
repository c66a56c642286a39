"""Inputs that used to run something other than what was asked are refused with one line: corrupt()'s seed and
severity types, an empty option value, a grid value listed twice, an old option spelling contradicting its new one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtl_cog.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("severity, seed, said", [
    (2, -1, "seed must be a whole number"), (2, 1.5, "seed must be a whole number"),
    (2, 2**32, "seed must be a whole number"), (2, True, "seed must be a whole number"),
    (2.0, 0, "severity must be 1..5"), (np.float32(3), 0, "severity must be 1..5"), ("2", 0, "severity"),
])
def test_corrupt_refuses_a_seed_or_severity_of_the_wrong_type(severity, seed, said):
    from mtl_cog.data.shift import corrupt

    with pytest.raises(ConfigError, match=said):
        corrupt(np.zeros((1, 32, 32, 3), np.uint8), "gaussian_noise", severity, seed=seed)


def test_corrupt_takes_numpy_integers():
    from mtl_cog.data.shift import corrupt

    assert corrupt(np.zeros((1, 32, 32, 3), np.uint8), "gaussian_noise", np.int64(2), seed=np.uint32(7)).shape == \
        (1, 32, 32, 3)


@pytest.mark.parametrize("argv", [["--method", ""], ["--data", " "], ["--config", ""]])
def test_an_empty_option_value_is_refused_not_taken_for_the_default(argv):
    from mtl_cog.cli import train

    with pytest.raises(UserError, match="an empty value"):
        train.parse_args(argv)


def test_a_grid_value_listed_twice_is_refused():
    from mtl_cog.experiments.sweep import parse_grid

    with pytest.raises(ConfigError, match="lists 0 more than once"):
        parse_grid(["seed=0,0"])
    with pytest.raises(ConfigError, match="lists 1e-3 more than once"):
        parse_grid(["optim.follower_lr=1e-3,3e-2,1e-3"])
    assert len(parse_grid(["seed=0,1"])[0].values) == 2


@pytest.mark.parametrize("argv", [["--data", "synthetic", "--datasets", "digits"],
                                  ["--datasets", "digits", "--data", "synthetic"],
                                  ["--method", "cog_fc", "--methods", "baseline"]])
def test_an_old_spelling_contradicting_its_new_one_is_refused(argv):
    from mtl_cog.cli import reproduce

    with pytest.raises(UserError, match="name the same option with different values"):
        reproduce.parse_args(argv)


def test_the_command_says_so_in_one_line():
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.main", "train", "--method", "", "--dry-run"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "an empty value" in done.stderr
    assert "Traceback" not in done.stderr
