"""``--resume RUN_DIR key=value``: a changed setting is applied exactly from the first resumed step, or refused."""

from __future__ import annotations

import json

import pytest

from mtl_cog.cli import train
from mtl_cog.errors import ConfigError
from mtl_cog.runs import rundir

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _epochs(run):
    return [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()
            if "final" not in json.loads(line)]


@pytest.fixture
def stopped_run(tiny_overrides):
    """A run that trained 2 epochs and is resumable (its DONE removed, as if stopped before the end)."""
    run = train.main([*tiny_overrides, "run_name=r", "optim.follower_lr=1e-3", "optim.leader_lr=1e-4",
                      "optim.lr_step_epochs=2", "optim.lr_gamma=0.5"])
    (run / rundir.DONE).unlink()
    return run


def test_changed_learning_rates_and_schedule_take_effect_from_the_first_resumed_step(stopped_run):
    train.main(["--resume", str(stopped_run), "train.epochs=6", "optim.follower_lr=0.0123",
                "optim.lr_step_epochs=3", "optim.lr_gamma=0.1"])
    lrs = [line["lr"]["follower"] for line in _epochs(stopped_run)]
    # epochs 1-2 at 1e-3 (the step at the end of epoch 2 decays to 5e-4, then the resume sets the new rate);
    # epoch 3 onwards: 0.0123, and the new schedule (x0.1 every 3 epochs) decays after epoch 3
    assert lrs[:2] == pytest.approx([1e-3, 1e-3])
    assert lrs[2:] == pytest.approx([0.0123, 0.00123, 0.00123, 0.00123])
    saved = (stopped_run / rundir.CONFIG).read_text()
    assert "follower_lr: 0.0123" in saved and "lr_step_epochs: 3" in saved
    history = [json.loads(line) for line in (stopped_run / rundir.RESUMES).read_text().splitlines()]
    assert history[0]["epoch"] == 3 and history[0]["changed"]["optim.follower_lr"] == {"old": 1e-3, "new": 0.0123}


@pytest.mark.parametrize("override", ["model.backbone=cog_cnn_small", "seed=7", "train.batch_size=16",
                                      "method.loss=ls", "eval.selection_metric=nll"])
def test_a_change_the_saved_state_cannot_follow_is_refused_before_anything_is_written(stopped_run, override):
    before = (stopped_run / rundir.CONFIG).read_text()
    with pytest.raises(ConfigError, match=f"--resume cannot change {override.split('=')[0]}"):
        train.main(["--resume", str(stopped_run), override])
    assert (stopped_run / rundir.CONFIG).read_text() == before  # config.yaml still describes what ran


def test_fewer_epochs_than_already_trained_is_refused(stopped_run):
    with pytest.raises(ConfigError, match="below the 2 epochs"):
        train.main(["--resume", str(stopped_run), "train.epochs=1"])


def test_a_run_folder_moved_with_its_campaign_resumes_where_it_lies(stopped_run, tmp_path):
    """A campaign folder moved (or copied to another machine) passes its new output_dir: the run continues in the
    folder it was resumed from, and config.yaml / resumes.jsonl record the new location."""
    import shutil

    moved = tmp_path / "moved" / stopped_run.name
    shutil.copytree(stopped_run, moved)
    train.main(["--resume", str(moved), f"output_dir={moved.parent}", "train.epochs=3"])
    assert (moved / rundir.DONE).exists() and len(_epochs(moved)) == 3
    assert not (stopped_run / rundir.DONE).exists()  # the old folder untouched
    history = [json.loads(line) for line in (moved / rundir.RESUMES).read_text().splitlines()]
    assert history[0]["changed"]["output_dir"]["new"] == str(moved.parent)
    with pytest.raises(ConfigError, match="is not the folder the run lies in"):
        train.main(["--resume", str(stopped_run), f"output_dir={tmp_path / 'elsewhere'}"])
