"""A calibrated model ships as one ``torch.export`` file that plain torch loads, calibrator inside.

``run.export`` must give ``predict_proba``'s numbers from uint8 test images, and the file must run in a
Python that never imports mtl_cog or timm; ``cog.export`` does the same for a wrapped user model.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import timm
import torch

from mtl_cog import cog, load_run
from mtl_cog.cli import train
from mtl_cog.data.loading import load_task
from mtl_cog.errors import CogError

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

# Runs in a fresh interpreter: the exported file, applied to each of some saved batches, with nothing but torch.
PLAIN_TORCH = """
import sys, torch
program = torch.export.load(sys.argv[1]).module()
with torch.no_grad():
    out = [program(batch) for batch in torch.load(sys.argv[2], weights_only=True)]
torch.save(out, sys.argv[3])
assert not [m for m in sys.modules if m.split(".")[0] in ("mtl_cog", "timm")], "the file needed mtl_cog or timm"
"""


def plain_torch(path, batches, tmp_path):
    """What the exported file at ``path`` gives for each of ``batches``, in a Python without mtl_cog."""
    torch.save(batches, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", PLAIN_TORCH, str(path), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "out.pt", weights_only=True)


def test_an_exported_run_gives_predict_proba_on_the_test_split(tmp_path):
    run_dir = train.main(["--config", "configs/synthetic/cog_ts.yaml", f"output_dir={tmp_path}", "run_name=ts",
                          "tracking=none", "train.epochs=1", "train.batch_size=32", "model.backbone=cog_cnn_tiny",
                          "data.synthetic.num_attributes=5", "data.synthetic.train_size=96",
                          "data.synthetic.val_size=50", "data.synthetic.test_size=37", "optim.leader_lr=1e-2",
                          "optim.follower_lr=2e-2"])
    run = load_run(run_dir)
    assert run.calibrator_parameters()["temperature"]  # a learned calibrator, which the file must hold
    images = load_task(run.config.data).splits["test"].images
    expected = run.predict_proba(images)
    path = run.export(tmp_path / "model.pt2")
    got, three = plain_torch(path, [images, images[:3]], tmp_path)  # any batch size, not just the example's
    assert list(got) == run.task_names
    for name in run.task_names:
        assert got[name].dtype == torch.float64
        np.testing.assert_allclose(got[name].numpy(), expected[name], rtol=0, atol=1e-12)
    np.testing.assert_allclose(three[run.task_names[0]].numpy(), expected[run.task_names[0]][:3], rtol=0,
                               atol=1e-12)


def test_a_wrapped_user_model_exports_with_its_calibrator(tmp_path):
    torch.manual_seed(0)
    model = cog.Calibrated(timm.create_model("test_resnet", num_classes=10), "ts", tasks=10).eval()
    with torch.no_grad():
        model.calibrator.log_temperature.fill_(0.7)  # a calibrator away from the identity
        images = torch.randn(5, 3, 32, 32)
        expected = model(images)
    [got] = plain_torch(cog.export(model, tmp_path / "mine.pt2", images[:2]), [images], tmp_path)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    uncalibrated = model.model(images).detach()
    assert not torch.allclose(got, uncalibrated, atol=1e-3)  # the temperature is in the file


def test_a_program_fixed_to_the_examples_batch_size_is_refused_before_it_is_written():
    model = cog.Calibrated(timm.create_model("test_resnet", num_classes=3), "ts", tasks=3).eval()
    with torch.no_grad():
        fixed = torch.export.export(model, (torch.randn(2, 3, 32, 32),))  # no dynamic batch: the failure mode
    with pytest.raises(CogError, match="fixed the batch size of input 'args_0' to 2"):
        cog._check_any_batch_size(fixed)
