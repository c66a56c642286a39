import numpy as np
import pytest

from mtl_cog.errors import PredictionFileError
from mtl_cog.evaluation.predictions import Predictions, load_predictions, save_predictions


def _preds():
    rng = np.random.default_rng(0)
    return Predictions(["Smiling", "digit"], [rng.normal(size=10), rng.normal(size=(10, 3))],
                       [rng.integers(0, 2, 10), rng.integers(0, 3, 10)])


def test_roundtrip(tmp_path):
    path = tmp_path / "p.npz"
    save_predictions(path, _preds())
    back = load_predictions(path)
    assert back.task_names == ["Smiling", "digit"]
    assert back.logits[0].shape == (10,) and back.logits[1].shape == (10, 3)
    assert np.array_equal(back.labels[1], _preds().labels[1])
    assert set(np.load(path).files) == {"task_names", "logits/Smiling", "labels/Smiling", "logits/digit",
                                        "labels/digit"}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.pop("labels/digit"), "missing key 'labels/digit'"),
        (lambda a: a.__setitem__("labels/Smiling", np.zeros(9, dtype=int)), "10 logits but 9 labels"),
        (lambda a: a["logits/Smiling"].__setitem__(3, np.nan), "NaN"),
        (lambda a: a.__setitem__("labels/digit", np.full(10, 5)), "labels must be in [0, 2]"),
    ],
)
def test_bad_files_are_refused_with_a_named_problem(tmp_path, mutate, message):
    path = tmp_path / "p.npz"
    save_predictions(path, _preds())
    arrays = dict(np.load(path))
    mutate(arrays)
    np.savez(path, **arrays)
    with pytest.raises(PredictionFileError) as err:
        load_predictions(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_not_an_npz(tmp_path):
    path = tmp_path / "p.npz"
    path.write_text("hello")
    with pytest.raises(PredictionFileError, match="not a readable"):
        load_predictions(path)
