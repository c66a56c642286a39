"""scripts/sweep.py: grid parsing, choice by validation NLL, and one real (tiny) sweep."""

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mtl_cog.config import load_config
from mtl_cog.errors import ConfigError
from mtl_cog.experiments.sweep import best_index, combinations, parse_grid, split_values

REPO = Path(__file__).resolve().parents[1]


def test_split_values_keeps_brackets_together():
    assert split_values("1e-5,3e-5, 1e-4") == ["1e-5", "3e-5", "1e-4"]
    assert split_values("[5,15],[10]") == ["[5,15]", "[10]"]


def test_combinations_cover_the_grid_in_order():
    axes = parse_grid(["optim.leader_lr=1e-5,3e-5,1e-4", "optim.follower_lr=1e-3,3e-4"])
    combos = combinations(axes)
    assert len(combos) == 6
    assert combos[0] == {"optim.leader_lr": "1e-5", "optim.follower_lr": "1e-3"}
    assert combos[1] == {"optim.leader_lr": "1e-5", "optim.follower_lr": "3e-4"}
    assert len({tuple(c.values()) for c in combos}) == 6


@pytest.mark.parametrize("item", ["optim.leader_lr", "=1,2", "optim.leader_lr=1e-5,"])
def test_bad_grid_items_are_refused(item):
    with pytest.raises(ConfigError, match="--grid item"):
        parse_grid([item])


def test_best_index_ignores_failed_runs():
    assert best_index([0.7, math.nan, 0.5, 0.5]) == 2
    assert best_index([math.nan]) is None


def _sweep_script():
    return importlib.import_module("mtl_cog.cli.sweep")


def test_invalid_combination_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="leader_lr"):
        _sweep_script().main(["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), "--out",
                              str(tmp_path / "s"), "--grid", "optim.leader_lr=1e-5,1e-2", "optim.follower_lr=1e-3"])
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_real_sweep_picks_the_lowest_validation_nll(tiny_overrides, tmp_path):
    out = tmp_path / "sweep"
    overrides = [o for o in tiny_overrides if not o.startswith("output_dir")] + ["train.epochs=1"]
    best = _sweep_script().main(["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), *overrides,
                                 "--out", str(out), "--parallel", "2",
                                 "--grid", "optim.leader_lr=1e-5,1e-4", "optim.follower_lr=1e-3,3e-2"])
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 4 and (table["status"] == "ok").all()
    chosen = table[table["chosen"] == "*"]
    assert len(chosen) == 1 and chosen["val_nll"].iloc[0] == table["val_nll"].min()
    assert (out / "sweep.md").read_text().startswith("| run |")
    cfg = load_config(best)  # the chosen config is usable as --config
    row = chosen.iloc[0]
    assert cfg.optim.leader_lr == pytest.approx(float(row["optim.leader_lr"]))
    assert cfg.optim.follower_lr == pytest.approx(float(row["optim.follower_lr"]))
    assert yaml.safe_load(best.read_text())["run_name"] is None


def test_a_rerun_sweep_reuses_finished_runs_and_resumes_unfinished_ones(tmp_path):
    from mtl_cog.config import save_config
    from mtl_cog.errors import UserError
    from mtl_cog.experiments.sweep import DONE, NEW, UNFINISHED, run_state
    from mtl_cog.runs import rundir

    cfg = load_config("configs/digits/baseline.yaml", ["train.epochs=1"])
    run = tmp_path / "run_00"
    assert run_state(run, cfg) == NEW
    run.mkdir()
    save_config(cfg, run / rundir.CONFIG)
    assert run_state(run, cfg) == UNFINISHED  # interrupted or failed: continued, not counted as failed
    (run / rundir.DONE).write_text("best_epoch=1\n")
    assert run_state(run, cfg) == DONE
    with pytest.raises(UserError, match="other settings"):
        run_state(run, load_config("configs/digits/baseline.yaml", ["train.epochs=2"]))
