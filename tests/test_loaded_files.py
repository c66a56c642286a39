"""A loaded file is checked against what wrote it, and for types, ranges and uniqueness (docs/guides/failure_paths.md).

Readers of a finished run (``load_run``/``predict_proba``, ``evaluate --run``, ``evaluate --posthoc``)
check the files they use against ``digests.json``, written by the run just before ``DONE``; every
loader also checks what it parses (the task spec's fields, the weights' dtypes, the logits' range).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_robustness import script, tiny, user_error

from mtl_cog.data.task_api import TaskSpec
from mtl_cog.errors import DataError, PredictionFileError, RunFolderError, UserError
from mtl_cog.evaluation.predictions import Predictions, load_predictions, save_predictions
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import covered_files, record_digests
from mtl_cog.runs.trained import load_run

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    return script("train_mtl").main(tiny(tmp, "run_name=r", "train.epochs=2"))


@pytest.fixture
def run(finished, tmp_path) -> Path:
    target = tmp_path / "r"
    shutil.copytree(finished, target)
    return target


def _spec(run: Path) -> dict:
    return json.loads((run / rundir.TASK_SPEC).read_text())


def _write_spec(run: Path, spec: object, record: bool) -> None:
    (run / rundir.TASK_SPEC).write_text(json.dumps(spec))
    if record:  # as if the run itself had written it: only the content checks can refuse it
        record_digests(run)


def test_a_finished_run_records_the_digest_of_what_readers_use(finished):
    recorded = json.loads((finished / rundir.DIGESTS).read_text())["files"]
    assert {rundir.CONFIG, rundir.TASK_SPEC, rundir.BEST_MODEL, rundir.TEST_METRICS,
            rundir.predictions_file("val"), rundir.predictions_file("test")} <= set(recorded) <= set(covered_files())
    load_run(finished)  # intact: loads without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run(finished)


@pytest.mark.parametrize("edit", [
    lambda s: s.update(mean=[s["mean"][0] + 0.01, *s["mean"][1:]]),  # a plausible mean: only the digest sees it
    lambda s: s.update(task_names=list(reversed(s["task_names"]))),  # permuted names: every task misreported
])
def test_a_spec_edited_after_the_run_is_refused_by_its_digest(run, edit):
    spec = _spec(run)
    edit(spec)
    _write_spec(run, spec, record=False)
    with pytest.raises(RunFolderError, match="task_spec.json is not the file this run wrote"):
        load_run(run)


def _edited(**fields):
    return lambda spec: {**spec, **{k: v(spec) if callable(v) else v for k, v in fields.items()}}


@pytest.mark.parametrize("edit, message", [
    (lambda s: [], "expected a JSON object"),
    (lambda s: None, "expected a JSON object"),
    (_edited(mean=[float("nan")] * 3), "mean must be 3 finite"),
    (_edited(std=[0.0] * 3), "std must be 3 finite per-channel values > 0"),
    (_edited(std=[0.2, -0.2, 0.2]), "std must be 3 finite per-channel values > 0"),
    (_edited(std=[0.2, 0.2]), "std must be 3 finite per-channel values > 0"),
    (_edited(mean=[1.7] * 3), "mean must be 3 finite per-channel values in [0, 1]"),
    (_edited(task_names=lambda s: [s["task_names"][0]] * len(s["task_names"])), "appear more than once"),
    (_edited(task_names=[]), "non-empty list of names"),
    (_edited(task_names=lambda s: list(range(len(s["task_names"])))), "non-empty string"),
    (_edited(num_classes=lambda s: [1] * len(s["num_classes"])), "integer number of classes >= 2"),
    (_edited(num_classes=lambda s: [2.5] * len(s["num_classes"])), "integer number of classes >= 2"),
])
def test_a_spec_that_parses_is_checked_for_types_ranges_and_uniqueness(run, edit, message):
    """Even with matching digests (or a run from before digests) a spec that would poison every number is refused."""
    _write_spec(run, edit(_spec(run)), record=True)
    with pytest.raises(RunFolderError, match="task_spec.json is not a valid task spec") as err:
        load_run(run)
    assert message in str(err.value)


def test_weights_of_another_dtype_or_another_run_are_refused(run, finished, tmp_path):
    state = load_file(str(run / rundir.BEST_MODEL))
    int8 = {k: v.round().to(torch.int8) if v.is_floating_point() else v for k, v in state.items()}
    save_file(int8, str(run / rundir.BEST_MODEL))
    with pytest.raises(RunFolderError, match="best_model.safetensors is not the file this run wrote"):
        load_run(run)
    record_digests(run)  # even if recorded: the loader refuses a dtype training never writes
    with pytest.raises(UserError, match="another dtype than the model's"):
        load_run(run)
    other = script("train_mtl").main(tiny(tmp_path, "run_name=other", "seed=5"))
    shutil.copy(other / rundir.BEST_MODEL, run / rundir.BEST_MODEL)  # same shapes, another run's weights
    shutil.copy(finished / rundir.DIGESTS, run / rundir.DIGESTS)
    with pytest.raises(RunFolderError, match="not the file this run wrote"):
        load_run(run)


def test_a_damaged_or_missing_record_and_an_old_run_without_one(run):
    (run / rundir.DIGESTS).write_text("{not json")
    with pytest.raises(RunFolderError, match="digests.json is damaged"):
        load_run(run)
    (run / rundir.DIGESTS).unlink()  # a run from before digests: accepted, with a warning saying what is checked
    with pytest.warns(UserWarning, match="checked for types and ranges, but not against what wrote them"):
        load_run(run)


def test_evaluate_checks_the_same_files(run, tmp_path, capsys):
    (run / rundir.predictions_file("val")).write_bytes((run / rundir.predictions_file("test")).read_bytes())
    err = user_error("evaluate", ["--run", str(run), "--posthoc", "ts"], capsys)
    assert "predictions_val.npz is not the file this run wrote" in err
    spec = _spec(run)
    spec["std"] = [0.3, 0.3, 0.3]
    _write_spec(run, spec, record=False)
    err = user_error("evaluate", ["--run", str(run), "--out", str(tmp_path / "m.json")], capsys)
    assert "task_spec.json is not the file this run wrote" in err


def test_evaluate_refuses_an_unfinished_run_unless_asked(run, tmp_path, capsys):
    (run / rundir.DONE).unlink()
    out = tmp_path / "m.json"
    err = user_error("evaluate", ["--run", str(run), "--out", str(out)], capsys)
    assert "has not finished" in err and "--unfinished" in err and not out.exists()
    metrics = script("evaluate").main(["--run", str(run), "--out", str(out), "--unfinished"])
    assert out.exists() and np.isfinite(metrics["mean"]["nll"])


def test_evaluate_refuses_a_data_set_that_changed_since_training(run, tmp_path, capsys):
    """The spec of the data under data.root must be the run's own (here: the synthetic task got another size)."""
    spec = _spec(run)
    spec["task_names"] = [f"{n}_renamed" for n in spec["task_names"]]
    _write_spec(run, spec, record=True)
    err = user_error("evaluate", ["--run", str(run), "--out", str(tmp_path / "m.json")], capsys)
    assert "no longer matches the run's task_spec.json" in err


def test_task_spec_refuses_duplicate_names_whoever_builds_it():
    with pytest.raises(DataError, match=r"\['a'\] appear more than once"):
        TaskSpec("d", ("a", "b", "a"), (2, 2, 2), (0.5,) * 3, (0.25,) * 3)


# ------------------------------------------------------------------- numbers that overflow on the way in


@pytest.mark.parametrize("value", [1e39, -3.5e38, 1e300])
def test_float64_logits_beyond_float32_are_refused_not_made_infinite(tmp_path, value, capsys):
    path = tmp_path / "p.npz"
    z = np.array([0.5, value, -1.0])
    np.savez(path, task_names=np.array(["a"]), **{"logits/a": z, "labels/a": np.array([0, 1, 0])})
    with pytest.raises(PredictionFileError, match="exceed float32's range"):
        load_predictions(path)
    err = user_error("evaluate", ["--predictions", str(path), "--out", str(tmp_path / "m.json")], capsys)
    assert "exceed float32's range" in err and not (tmp_path / "m.json").exists()
    with pytest.raises(PredictionFileError, match="exceed float32's range"):
        save_predictions(tmp_path / "q.npz", Predictions(["a"], [z], [np.array([0, 1, 0])]))
    assert not (tmp_path / "q.npz").exists()


def test_float64_logits_within_float32_still_load(tmp_path):
    path = tmp_path / "p.npz"
    np.savez(path, task_names=np.array(["a"]), **{"logits/a": np.array([0.5, 3e38]), "labels/a": np.array([0, 1])})
    assert load_predictions(path).logits[0].dtype == np.float32


# ----------------------------------------------------------------------------- predict_proba arguments


@pytest.mark.parametrize("batch_size", [-1, 0, 2.0, True, "8"])
def test_predict_proba_refuses_a_batch_size_that_is_not_a_count(finished, batch_size):
    trained = load_run(finished)
    size = trained.config.data.image_size
    with pytest.raises(UserError, match="batch_size must be a whole number >= 1"):
        trained.predict_proba(np.zeros((3, 3, size, size), np.uint8), batch_size=batch_size)


def test_predict_proba_takes_views_with_negative_strides(finished):
    trained = load_run(finished)
    size = trained.config.data.image_size
    images = np.random.default_rng(0).integers(0, 256, (4, 3, size, size), dtype=np.uint8)
    flipped = trained.predict_proba(images[:, :, :, ::-1], batch_size=3)
    copied = trained.predict_proba(np.ascontiguousarray(images[:, :, :, ::-1]), batch_size=3)
    assert all(np.array_equal(flipped[name], copied[name]) for name in trained.task_names)
