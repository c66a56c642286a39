"""A refused command writes nothing: every check that can refuse runs before the first file is written.

Per family of command: ``train --resume`` (a setting that cannot change, fewer epochs than already
trained, a damaged training state; real run and dry run), ``evaluate --posthoc`` (a method that
fails after others were fitted). After the refusal every file of the run is byte-identical, and a
plain ``--resume`` then continues the run to the numbers of a run that was never interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_cog.cli import evaluate, train
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import load_config
from mtl_cog.errors import CheckpointError, ConfigError, PosthocError
from mtl_cog.evaluation import posthoc
from mtl_cog.runs import rundir
from mtl_cog.training import Hooks, fit

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

EPOCHS = 4
KILLED_AT = 3  # the run stops during epoch 3 of 4: epochs 1-2 trained and saved


class Killed(Exception):
    """Stands in for a kill: raised inside the epoch loop, before the epoch's state is saved."""


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != rundir.LOCK}


def _kill_at(epoch: int):
    def hook(end) -> None:
        if end.stage == "stage_one" and end.epoch == epoch:
            raise Killed
    return Hooks(on_epoch_end=hook)


@pytest.fixture
def killed_run(tiny_overrides, tmp_path):
    """A 4-epoch run stopped in epoch 3 (its state says: continue at epoch 3)."""
    cfg = load_config(CONFIGS / "synthetic" / "cog_fc.yaml",  # what train.main uses without --config
                      [*tiny_overrides, f"train.epochs={EPOCHS}", "run_name=killed"])
    with pytest.raises(Killed):
        fit(cfg, hooks=_kill_at(KILLED_AT))
    return Path(cfg.output_dir) / "killed"


def _epoch_lines(run: Path) -> list[dict]:
    return [line for line in map(json.loads, (run / rundir.METRICS).read_text().splitlines()) if not line.get("final")]


@pytest.mark.slow  # three trainings per case
@pytest.mark.parametrize("argv, error, match", [
    (["train.epochs=1"], ConfigError, "below the 2 epochs"),
    (["seed=7"], ConfigError, "cannot change seed"),
    (["--dry-run", "train.epochs=1"], ConfigError, "below the 2 epochs"),
])
def test_a_refused_resume_leaves_every_file_as_it_was_and_the_next_resume_finishes_the_run(
        killed_run, tiny_overrides, argv, error, match):
    before = _files(killed_run)
    assert not (killed_run / rundir.DONE).exists()
    with pytest.raises(error, match=match):
        train.main(["--resume", str(killed_run), *argv])
    assert _files(killed_run) == before  # config.yaml included: it still says what ran

    train.main(["--resume", str(killed_run)])
    assert (killed_run / rundir.DONE).is_file()
    assert [line["epoch"] for line in _epoch_lines(killed_run)] == list(range(1, EPOCHS + 1))
    assert load_config(killed_run / rundir.CONFIG).train.epochs == EPOCHS
    # the same numbers as a run never interrupted
    whole = train.main([*tiny_overrides, f"train.epochs={EPOCHS}", "run_name=whole"])
    assert (killed_run / rundir.TEST_METRICS).read_bytes() == (whole / rundir.TEST_METRICS).read_bytes()


def test_a_damaged_training_state_is_refused_before_config_yaml_changes(killed_run):
    state = killed_run / rundir.STATE
    state.write_bytes(state.read_bytes()[:100])  # cut short
    before = _files(killed_run)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        train.main(["--resume", str(killed_run), "train.epochs=9"])
    assert _files(killed_run) == before


@pytest.mark.slow  # a training and two post-hoc fits
def test_a_posthoc_method_that_fails_leaves_no_file_of_the_methods_fitted_before_it(tiny_overrides, monkeypatch):
    run = train.main([*tiny_overrides, "run_name=posthoc"])
    before = _files(run)

    def refuse(self, val, images=None):
        raise PosthocError("post-hoc 'histogram' failed on task 'attr0': planted failure")

    monkeypatch.setattr(posthoc.HistogramBinning, "fit", refuse)
    with pytest.raises(PosthocError, match="planted failure"):
        evaluate.main(["--run", str(run), "--posthoc", "ts", "vs", "histogram"])
    assert _files(run) == before  # no predictions_test_ts.npz, no posthoc_metrics.csv
    monkeypatch.undo()
    evaluate.main(["--run", str(run), "--posthoc", "ts", "vs", "histogram"])
    assert {rundir.POSTHOC_METRICS, rundir.posthoc_predictions_file("test", "ts")} <= set(_files(run))
