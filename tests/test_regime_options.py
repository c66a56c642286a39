"""The options that put a run into an overconfident regime and score it under both checkpoint rules:
``data.train_size`` (a nested, fixed subset of the training split), ``data.augment`` (the task's augmentation
off) and ``eval.score_last_epoch`` (the last epoch's network scored beside the selected checkpoint)."""

import json

import numpy as np
import pytest
import torch

from mtl_cog.bundles.bundle_rows import results_rows
from mtl_cog.config import load_config
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import SplitData
from mtl_cog.errors import ConfigError
from mtl_cog.runs import rundir
from mtl_cog.training.loop import fit


def _split(n: int) -> SplitData:
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 2, 2).contiguous()
    return SplitData(images, torch.arange(n).view(n, 1))


def test_train_subset_is_fixed_nested_and_ordered():
    split = _split(200)
    small, large = split.subset(50, seed=0), split.subset(120, seed=0)
    small_ids, large_ids = small.labels[:, 0].numpy(), large.labels[:, 0].numpy()
    assert len(small_ids) == 50 and len(set(small_ids)) == 50  # without replacement
    assert set(small_ids) <= set(large_ids)  # a smaller subset is part of every larger one
    assert np.all(np.diff(large_ids) > 0)  # kept in the split's order
    assert np.array_equal(small_ids, split.subset(50, seed=0).labels[:, 0].numpy())  # fixed by the seed
    assert not np.array_equal(small_ids, split.subset(50, seed=1).labels[:, 0].numpy())
    assert torch.equal(small.images[:, 0, 0, 0].long(), small.labels[:, 0])  # images follow their labels
    assert split.subset(None) is split and split.subset(500) is split


def test_train_size_keeps_validation_and_test(tiny_overrides):
    cfg = load_config("configs/synthetic/baseline.yaml", [*tiny_overrides, "data.train_size=40"])
    data = load_task(cfg.data)
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [40, 50, 37]


@pytest.mark.parametrize("value", ["0", "-3", "true"])
def test_bad_train_size_is_refused(tiny_overrides, value):
    with pytest.raises(ConfigError, match="data.train_size"):
        load_config("configs/synthetic/baseline.yaml", [*tiny_overrides, f"data.train_size={value}"])


def test_train_size_above_the_split_is_refused(tiny_overrides):
    cfg = load_config("configs/synthetic/baseline.yaml", [*tiny_overrides, "data.train_size=97"])
    with pytest.raises(ConfigError, match="more than the 96 training images"):
        load_task(cfg.data)


def test_augment_false_turns_the_tasks_augmentation_off(tiny_overrides):
    on = load_config("configs/digits/baseline.yaml", [*tiny_overrides, "data.max_samples=20"])
    off = load_config("configs/digits/baseline.yaml", [*tiny_overrides, "data.max_samples=20", "data.augment=false"])
    assert load_task(on.data).spec.pad_crop > 0
    spec = load_task(off.data).spec
    assert (spec.pad_crop, spec.hflip) == (0, False)


def test_last_epoch_is_scored_beside_the_selected_checkpoint(tiny_overrides):
    # a rate that overshoots: validation Brier is best at epoch 1, so the two rules score different networks
    cfg = load_config("configs/synthetic/baseline.yaml",
                      [*tiny_overrides, "train.epochs=3", "eval.score_last_epoch=true", "optim.follower_lr=0.2"])
    run_dir = fit(cfg).run_dir
    assert (run_dir / rundir.DONE).read_text().strip() == "best_epoch=1"
    for split in ("val", "test"):
        assert (run_dir / rundir.predictions_file(rundir.last_epoch_split(split))).is_file()
    rows = results_rows(run_dir, ("ts",))
    assert {"val", "test", "test+ts", "val@last", "test@last", "test@last+ts"} == set(rows["split"])
    brier = rows[(rows.task == "mean") & (rows.metric == "brier")].set_index("split")["value"]
    epochs = [line for line in (run_dir / rundir.METRICS).read_text().splitlines() if '"epoch": 3' in line]
    assert brier["val@last"] == pytest.approx(json.loads(epochs[0])["val"]["brier"], rel=1e-5)
    assert brier["val"] < brier["val@last"]
    # the last epoch's files are under the run's digests: an edited one is refused
    path = run_dir / rundir.predictions_file(rundir.last_epoch_split("test"))
    path.write_bytes(path.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(Exception, match="predictions_test_last"):
        results_rows(run_dir, ("ts",))
