"""A resumed run logs what the uninterrupted one logs: the interrupted epoch's task weights are over all its steps."""

from __future__ import annotations

import pytest
from test_robustness import script, tiny

from mtl_cog.io import read_jsonl
from mtl_cog.runs import rundir
from mtl_cog.runs import training_state as state

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


class Killed(Exception):
    """Stands in for SIGKILL right after a mid-epoch save (the state on disk is all a resume gets)."""


@pytest.mark.parametrize("aggregator", ["mgda", "uncertainty"])
def test_task_weights_of_an_epoch_resumed_mid_way_equal_the_uninterrupted_ones(aggregator, tmp_path, monkeypatch):
    overrides = tiny(tmp_path, f"mtl.aggregator={aggregator}", "train.epochs=2", "train.batch_size=16",
                     "train.save_every_steps=2")
    reference = script("train_mtl").main([*overrides, "run_name=reference"])
    save = state.save_training_state

    def save_then_die(path, model, optimizer, scheduler, progress, objective=None):
        save(path, model, optimizer, scheduler, progress, objective)
        if progress.epoch == 2 and progress.within.step == 2:  # 2 of the epoch's 4 steps done
            raise Killed

    monkeypatch.setattr(state, "save_training_state", save_then_die)
    with pytest.raises(Killed):
        script("train_mtl").main([*overrides, "run_name=killed"])
    monkeypatch.undo()
    killed = tmp_path / "runs" / "killed"
    assert len(state.read_progress(killed / rundir.STATE).within.weight_sums) == 3  # the sums of 2 steps, per task
    script("train_mtl").main(["--resume", str(killed)])

    def weights(run):
        return [line["task_weights"] for line in read_jsonl(run / rundir.METRICS) if "task_weights" in line]

    assert len(weights(reference)) == 2 and weights(killed) == weights(reference)  # exactly, not approximately


def test_a_state_with_damaged_weight_sums_is_refused():
    with pytest.raises(ValueError, match="within.weight_sums"):
        state.Progress.from_dict({"epoch": 2, "within": {"step": 1, "weight_sums": ["x"]}})
