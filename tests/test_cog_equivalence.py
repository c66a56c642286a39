"""``fit`` runs on ``mtl_cog.cog``: a run and a short hand-written loop on the public API train the same bits.

The same config is trained twice on one thread: by ``fit`` (what ``mtl-cog train`` runs) and by
``hand_written_loop`` below, which uses only ``mtl_cog.cog``, a timm model and the batches ``fit`` drew
(recorded from its steps, so both see the same augmented images in the same order). The selected
epoch's weights and the test logits must be equal to the bit. A second implementation of the groups,
the calibrator or the step would show up here as a difference in the last bits.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import mtl_cog.models.backbones  # noqa: F401  (registers cog_cnn_tiny with timm, as any timm model)
from mtl_cog import cog
from mtl_cog.config import load_config
from mtl_cog.data.batches import BatchTransform
from mtl_cog.data.loading import load_task
from mtl_cog.evaluation.predictions import load_predictions
from mtl_cog.runs import rundir
from mtl_cog.training import Hooks, fit
from mtl_cog.training import step as training_step

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

TASKS = 5  # data.synthetic.num_attributes: five binary tasks, one logit each


def hand_written_loop(epochs, seed, calibrator, leader, lr, leader_lr, step_size, gamma):
    """What a user writes: a timm model, ``cog``'s wrapper and groups, Adam, a step schedule, BCE per task."""
    torch.manual_seed(seed)
    net = timm.create_model("cog_cnn_tiny", num_classes=TASKS)  # its fc: the 5 task heads
    model = cog.Calibrated(net, calibrator, tasks=[2] * TASKS, leader=leader)
    optimizer = torch.optim.Adam(cog.parameter_groups(model, lr=lr, leader_lr=leader_lr))
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=gamma)
    states = []
    for batches in epochs:
        model.train()
        for images, labels in batches:
            logits = model(images)
            # each task's mean over the batch, then the mean over tasks (equal task weights)
            loss = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(0).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        schedule.step()
        states.append(copy.deepcopy(model.state_dict()))
    return model, states


def as_run_keys(state: dict) -> dict:
    """The hand-written model's names -> the run's: model.features -> backbone.features, model.fc -> heads.fc."""
    def rename(key: str) -> str:
        return key.replace("model.fc.", "heads.fc.") if key.startswith("model.fc.") else \
            key.replace("model.", "backbone.", 1)
    return {rename(k): v for k, v in state.items()}


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("method", "calibrator", "leader"), [("cog_ts", "ts", ()), ("cog_fc", None, "fc")])
def test_fit_and_a_hand_written_loop_train_the_same_bits(tmp_path, monkeypatch, one_thread, method, calibrator,
                                                         leader):
    cfg = load_config([f"configs/synthetic/{method}.yaml"], [
        f"output_dir={tmp_path}", "tracking=none", "train.epochs=3", "train.batch_size=32", "train.eval_batch_size=64",
        "model.backbone=cog_cnn_tiny", f"data.synthetic.num_attributes={TASKS}", "data.synthetic.train_size=96",
        "data.synthetic.val_size=50", "data.synthetic.test_size=37", "optim.follower_lr=2e-2",
        "optim.leader_lr=1e-2", "optim.lr_step_epochs=2", "optim.lr_gamma=0.5"])
    steps, ends = [], []
    recorded = training_step.batch_loss

    def record(network, objective, images, labels):
        steps.append((images.clone(), labels.clone()))
        return recorded(network, objective, images, labels)

    monkeypatch.setattr(training_step, "batch_loss", record)
    result = fit(cfg, hooks=Hooks(on_epoch_end=lambda end: ends.append(len(steps))))
    epochs = [steps[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    assert [len(e) for e in epochs] == [3, 3, 3]

    model, states = hand_written_loop(epochs, cfg.seed, calibrator, leader, cfg.optim.follower_lr,
                                      cfg.optim.leader_lr, cfg.optim.lr_step_epochs, cfg.optim.lr_gamma)
    saved = load_file(str(result.run_dir / rundir.BEST_MODEL))
    mine = as_run_keys(states[result.best_epoch - 1])
    assert sorted(mine) == sorted(saved)
    different = [k for k in saved if not torch.equal(saved[k], mine[k])]
    assert different == []
    assert not torch.equal(states[0]["calibrator.log_temperature" if calibrator else "model.fc.weight"],
                           states[-1]["calibrator.log_temperature" if calibrator else "model.fc.weight"])

    data = load_task(cfg.data)
    test = BatchTransform(data.spec, train=False)(data.splits["test"].images)
    model.load_state_dict(states[result.best_epoch - 1])
    with torch.no_grad():
        logits = torch.cat([model.eval()(test[i:i + 64]) for i in range(0, len(test), 64)]).numpy()
    run_logits = data.spec.layout.join(load_predictions(result.run_dir / rundir.predictions_file("test")).logits)
    assert run_logits.dtype == logits.dtype and np.array_equal(run_logits, logits)
