"""The Python API for trained runs: ``mtl_cog.load_run`` predicts like the run's own evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.special import expit, softmax

from mtl_cog import load_run
from mtl_cog.cli import train
from mtl_cog.data.loading import load_task
from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.evaluation.predictions import load_predictions
from mtl_cog.runs import rundir

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def cog_ts_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("api")
    return train.main(["--config", "configs/synthetic/cog_ts.yaml", f"output_dir={out}", "run_name=ts",
                       "tracking=none", "train.epochs=2", "train.batch_size=32", "model.backbone=cog_cnn_tiny",
                       "data.synthetic.num_attributes=5", "data.synthetic.train_size=96",
                       "data.synthetic.val_size=50", "data.synthetic.test_size=37", "optim.leader_lr=1e-2",
                       "optim.follower_lr=2e-2"])


def test_predict_proba_equals_the_runs_test_predictions(cog_ts_run):
    run = load_run(cog_ts_run)
    test = load_task(run.config.data).splits["test"]
    saved = load_predictions(cog_ts_run / rundir.predictions_file("test"))
    probs = run.predict_proba(test.images)  # a uint8 tensor
    assert list(probs) == saved.task_names
    for name, z in zip(saved.task_names, saved.logits):
        expected = expit(z.astype(np.float64)) if z.ndim == 1 else softmax(z.astype(np.float64), axis=1)
        np.testing.assert_allclose(probs[name], expected, atol=1e-5)
    as_numpy = run.predict_proba(test.images.numpy(), batch_size=7)  # numpy, odd batches: the same numbers
    np.testing.assert_allclose(as_numpy[saved.task_names[0]], probs[saved.task_names[0]], atol=1e-6)


def test_pil_images_are_brought_to_the_run_size_like_the_readers(cog_ts_run):
    run = load_run(cog_ts_run)
    test = load_task(run.config.data).splits["test"]
    pil = [Image.fromarray(img.permute(1, 2, 0).numpy()) for img in test.images[:5]]
    from_pil = run.predict_proba(pil)
    from_tensor = run.predict_proba(test.images[:5])
    for name in run.task_names:
        np.testing.assert_allclose(from_pil[name], from_tensor[name], atol=1e-6)
    bigger = [img.resize((64, 64), Image.BILINEAR) for img in pil]  # any size: resized and centre-cropped
    assert run.predict_proba(bigger)[run.task_names[0]].shape == (5,)


def test_calibrator_parameters_are_the_learned_temperatures(cog_ts_run):
    run = load_run(cog_ts_run)
    temperatures = run.calibrator_parameters()["temperature"]
    assert list(temperatures) == run.task_names
    expected = run.network.calibrator.log_temperature.detach().exp().tolist()
    assert list(temperatures.values()) == pytest.approx(expected)


def test_wrong_inputs_and_unfinished_runs_are_refused(cog_ts_run, tmp_path):
    run = load_run(cog_ts_run)
    size = run.config.data.image_size
    with pytest.raises(UserError, match=f"\\(N, 3, {size}, {size}\\)"):
        run.predict_proba(torch.zeros(2, 3, size + 1, size, dtype=torch.uint8))
    with pytest.raises(UserError, match="uint8"):
        run.predict_proba(torch.zeros(2, 3, size, size))
    assert run.predict_proba(np.zeros((0, 3, size, size), np.uint8))[run.task_names[0]].shape == (0,)
    (tmp_path / rundir.CONFIG).write_text((cog_ts_run / rundir.CONFIG).read_text())
    with pytest.raises(RunFolderError, match="not finished"):
        load_run(tmp_path)
