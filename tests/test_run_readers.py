"""Every reader of a run folder goes through one check: finished, the files it reads are the run's, its spec valid.

``mtl_cog.runs.finished.check_finished_run`` (docs/guides/failure_paths.md): ``load_run``, ``evaluate`` in every
mode (``--run``, ``--shift``, ``--posthoc``, ``--predictions`` of a run's own file), ``compare``,
``list-front`` and the campaigns' collection (``finished_predictions``) refuse a run killed mid-way and
a file swapped for another run's, with one ``error:`` line naming the run and the file, writing nothing.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_robustness import script, tiny, user_error

from mtl_cog.errors import CheckpointError, NonFiniteOutputError, PredictionFileError, RunFolderError
from mtl_cog.evaluation.predictions import Predictions, load_predictions, save_predictions
from mtl_cog.runs import rundir
from mtl_cog.runs.finished import check_finished_run, finished_predictions
from mtl_cog.runs.trained import load_run

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("readers")
    return (script("train_mtl").main(tiny(tmp, "run_name=a")),
            script("train_mtl").main(tiny(tmp, "run_name=b", "seed=1")))


@pytest.fixture
def runs(two_runs, tmp_path) -> tuple[Path, Path]:
    copies = []
    for run in two_runs:
        shutil.copytree(run, tmp_path / run.name)
        copies.append(tmp_path / run.name)
    return copies[0], copies[1]


def snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def test_an_intact_run_passes_and_its_predictions_are_read(runs):
    a, _ = runs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a run with digests: no warning
        assert check_finished_run(a, [rundir.BEST_MODEL]).seed == 0
        read = finished_predictions(a)
    assert set(read) == {"val", "test"}
    assert read["test"].task_names == load_predictions(a / rundir.predictions_file("test")).task_names


def test_a_run_killed_mid_way_is_refused_by_every_reader(runs, tmp_path, capsys):
    a, _ = runs
    (a / rundir.DONE).unlink()
    before = snapshot(a)
    for argv in (["--run", str(a), "--shift", "gaussian_noise", "--severities", "1"],
                 ["--run", str(a), "--posthoc", "ts"]):
        err = user_error("evaluate", argv, capsys)
        assert f"{a} has not finished" in err, err
    err = user_error("compare", [str(a), "--out", str(tmp_path / "report")], capsys)
    assert f"{a} has not finished" in err and not (tmp_path / "report").exists()
    with pytest.raises(RunFolderError, match="has not finished"):
        finished_predictions(a)
    with pytest.raises(RunFolderError, match="has not finished"):
        load_run(a)
    assert snapshot(a) == before  # nothing written into the run (no shift_metrics.csv, no posthoc files)


def test_files_swapped_for_another_runs_are_refused_by_every_reader(runs, tmp_path, capsys):
    a, b = runs
    for split in ("val", "test"):  # a leader curve's run whose predictions were replaced by another run's
        shutil.copy(b / rundir.predictions_file(split), a / rundir.predictions_file(split))
    with pytest.raises(RunFolderError, match="predictions_val.npz is not the file this run wrote"):
        finished_predictions(a)
    err = user_error("compare", [str(a.parent), "--out", str(tmp_path / "report")], capsys)
    assert "predictions_test.npz is not the file this run wrote" in err and str(a) in err
    err = user_error("evaluate", ["--predictions", str(a / rundir.predictions_file("test")),
                                  "--out", str(tmp_path / "m.json")], capsys)
    assert "predictions_test.npz is not the file this run wrote" in err and not (tmp_path / "m.json").exists()

    shutil.copy(b / rundir.BEST_MODEL, a / rundir.BEST_MODEL)  # weights of another run, same shapes
    before = snapshot(a)
    err = user_error("evaluate", ["--run", str(a), "--shift", "gaussian_noise", "--severities", "1"], capsys)
    assert "best_model.safetensors is not the file this run wrote" in err
    assert snapshot(a) == before


def test_an_old_run_without_digests_still_gets_its_predictions_checked_against_its_spec(runs):
    a, _ = runs
    (a / rundir.DIGESTS).unlink()
    test = load_predictions(a / rundir.predictions_file("test"))
    other = Predictions([f"{n}_other" for n in test.task_names], test.logits, test.labels)
    save_predictions(a / rundir.predictions_file("test"), other)
    with pytest.warns(UserWarning, match="no digests.json"), \
            pytest.raises(RunFolderError, match="not the run's"):
        finished_predictions(a)


def test_a_missing_file_and_a_folder_that_is_no_run(runs, tmp_path):
    a, _ = runs
    (a / rundir.predictions_file("val")).unlink()
    with pytest.raises(RunFolderError, match="predictions_val.npz is missing"):
        finished_predictions(a)
    with pytest.raises(RunFolderError, match="is not a run folder"):
        check_finished_run(tmp_path / "nothing")


# ----------------------------------------------------------------- weights that would predict NaN


def _old_run_with(run: Path, edit) -> None:
    """``run`` as a run from before digests, its best checkpoint edited by ``edit(name, tensor) -> tensor``."""
    state = load_file(str(run / rundir.BEST_MODEL))
    save_file({k: edit(k, v) for k, v in state.items()}, str(run / rundir.BEST_MODEL))
    (run / rundir.DIGESTS).unlink()


def _first(name: str):
    seen = []

    def pick(key: str) -> bool:
        if key.endswith(name) and not seen:
            seen.append(key)
            return True
        return False
    return pick


@pytest.mark.parametrize("edit, message", [
    # one BatchNorm variance below zero: its square root makes every later activation NaN
    (lambda pick: lambda k, v: v.clone().index_fill_(0, torch.tensor([0]), -0.5) if pick(k) else v,
     "running_var holds 1 negative value"),
    # random weights of the right shapes and dtypes (variances drawn from a normal: half negative)
    (lambda pick: lambda k, v: torch.randn_like(v) if v.is_floating_point() else v, "negative value"),
])
def test_weights_with_an_impossible_running_variance_are_refused(runs, edit, message, tmp_path, capsys):
    a, _ = runs
    _old_run_with(a, edit(_first("running_var")))
    with pytest.warns(UserWarning, match="no digests.json"), pytest.raises(CheckpointError, match=message):
        load_run(a)
    err = user_error("evaluate", ["--run", str(a), "--out", str(tmp_path / "m.json")], capsys)
    assert "values no training writes" in err and not (tmp_path / "m.json").exists()


def test_a_network_whose_outputs_are_not_finite_is_refused_wherever_it_predicts(runs, tmp_path, capsys):
    """Finite weights in range that overflow float32: predict_proba and evaluate refuse instead of returning NaN."""
    a, _ = runs
    _old_run_with(a, lambda k, v: v * 1e30 if v.is_floating_point() and k.endswith("weight") else v)
    with pytest.warns(UserWarning, match="no digests.json"):
        run = load_run(a)
    images = np.zeros((4, 3, 32, 32), np.uint8)
    with pytest.raises(NonFiniteOutputError, match="NaN or infinite logits for 4 of 4 images"):
        run.predict_proba(images)
    err = user_error("evaluate", ["--run", str(a), "--out", str(tmp_path / "m.json")], capsys)
    assert "NaN or infinite logits" in err and not (tmp_path / "m.json").exists()


def test_no_prediction_file_with_nan_logits_is_written(tmp_path):
    bad = Predictions(["a"], [np.array([0.1, np.nan])], [np.array([0, 1])])
    with pytest.raises(PredictionFileError, match="NaN or infinite"):
        save_predictions(tmp_path / "p.npz", bad)
    assert not (tmp_path / "p.npz").exists()


def test_a_campaign_collecting_results_refuses_a_swapped_or_unfinished_run(runs):
    """The leader curve's case: a run's predictions replaced by another run's are not scored into the bundle."""
    from mtl_cog.bundles.bundle_rows import results_rows

    a, b = runs
    assert set(results_rows(a)["split"]) == {"val", "test"}
    shutil.copy(b / rundir.predictions_file("test"), a / rundir.predictions_file("test"))
    with pytest.raises(RunFolderError, match="predictions_test.npz is not the file this run wrote"):
        results_rows(a)
    (b / rundir.DONE).unlink()
    with pytest.raises(RunFolderError, match="has not finished"):
        results_rows(b)
