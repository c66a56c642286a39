"""Readers of the real data sets, on tiny fixtures written in the official formats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from mtl_cog.config import DataConfig, FashionMosaicConfig, SyntheticConfig
from mtl_cog.data import task_api
from mtl_cog.data.task_api import TASKS, TaskSpec, block_length, check_labels
from mtl_cog.errors import DataError
from tasks.celeba import MAX_PIXELS, load_image
from tasks.cifar import carve_validation
from tasks.fixtures import (
    CELEBA_ATTRIBUTES,
    write_bomb_jpeg,
    write_celeba,
    write_cifar10,
    write_cifar100,
    write_fashion_mnist,
    write_svhn,
)


def cfg(task: str, root, **kw) -> DataConfig:
    return DataConfig(task=task, root=str(root), image_size=kw.pop("image_size", 32), **kw)


def read(task: str, data_cfg: DataConfig):
    """What ``load_task`` returns without a cache: the task's source decoded, capped by max_samples."""
    return TASKS.get(task).open(data_cfg).decode(data_cfg.max_samples)


def check_split(split, size: int, image_size: int = 32) -> None:
    assert split.images.dtype == torch.uint8
    assert tuple(split.images.shape) == (len(split), 3, image_size, image_size)
    assert split.labels.dtype == torch.int64
    assert len(split) == size


def test_all_tasks_registered():
    for name in ("celeba", "cifar10", "cifar100", "svhn", "digits", "synthetic", "fashion_mnist", "fashion_mosaic"):
        assert name in TASKS


# ---------------------------------------------------------------------------------------- CelebA


def test_celeba_reads_fixture(tmp_path):
    fx = write_celeba(tmp_path, n=60)
    data = read("celeba", cfg("celeba", tmp_path))
    assert data.spec.task_names == tuple(CELEBA_ATTRIBUTES)
    assert data.spec.num_classes == (2,) * 40
    assert data.spec.hflip and data.spec.pad_crop == 0
    order = {name: i for i, name in enumerate(fx.names)}
    for split, size in (("train", 36), ("val", 12), ("test", 12)):
        check_split(data.splits[split], size)
        rows = [order[n] for n in fx.split_names[split]]
        expected = (fx.values[rows] == 1).astype(np.int64)  # +1 -> 1, -1 -> 0
        assert np.array_equal(data.splits[split].labels.numpy(), expected)
    # the first test image, decoded by hand
    first = load_image(fx.image_dir / fx.split_names["test"][0], 32)
    assert np.array_equal(data.splits["test"].images[0].permute(1, 2, 0).numpy(), first)
    assert set(TASKS.get("celeba").source_files(cfg("celeba", tmp_path))) >= {fx.attr_file, fx.partition_file}


def test_celeba_resize_matches_torchvision(tmp_path):
    from torchvision import transforms

    fx = write_celeba(tmp_path, n=2)
    path = fx.image_dir / fx.names[0]
    for size in (32, 64, 100):
        ref = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size)])(
            Image.open(path).convert("RGB")
        )
        assert np.array_equal(load_image(path, size), np.asarray(ref))


def test_celeba_max_samples_decodes_only_kept_images(tmp_path):
    fx = write_celeba(tmp_path, n=60)
    (fx.image_dir / fx.split_names["train"][-1]).unlink()  # beyond the cap: must not be read
    data = read("celeba", cfg("celeba", tmp_path, max_samples=5))
    order = {name: i for i, name in enumerate(fx.names)}
    for split in ("train", "val", "test"):
        check_split(data.splits[split], 5)
        rows = [order[n] for n in fx.split_names[split][:5]]
        assert np.array_equal(data.splits[split].labels.numpy(), (fx.values[rows] == 1).astype(np.int64))


def _rewrite_line(path, line_index: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[line_index] = edit(lines[line_index])
    path.write_text("\n".join(lines) + "\n")


def _load_error(task: str, root, **kw) -> str:
    with pytest.raises(DataError) as info:
        read(task, cfg(task, root, **kw))
    return str(info.value)


def test_celeba_missing_root(tmp_path):
    msg = _load_error("celeba", tmp_path)
    assert str(tmp_path / "celeba") in msg and "torchvision.datasets.CelebA" in msg


def test_celeba_missing_attr_file(tmp_path):
    fx = write_celeba(tmp_path, n=5)
    fx.attr_file.unlink()
    assert str(fx.attr_file) in _load_error("celeba", tmp_path)


def test_celeba_wrong_column_count(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    _rewrite_line(fx.attr_file, 5, lambda s: s.rsplit(" ", 1)[0])  # file line 6 loses a value
    msg = _load_error("celeba", tmp_path)
    assert str(fx.attr_file) in msg and "line 6" in msg


def test_celeba_value_not_pm1(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    _rewrite_line(fx.attr_file, 3, lambda s: s[: -len(s.split()[-1])] + "2")  # last value -> 2
    msg = _load_error("celeba", tmp_path)
    assert str(fx.attr_file) in msg and "line 4" in msg and "'2'" in msg and "Young" in msg


def test_celeba_header_count_mismatch(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    _rewrite_line(fx.attr_file, 0, lambda s: "11")
    msg = _load_error("celeba", tmp_path)
    assert str(fx.attr_file) in msg and "11" in msg


def test_celeba_partition_disagrees(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    _rewrite_line(fx.partition_file, 2, lambda s: "999999.jpg 0")
    msg = _load_error("celeba", tmp_path)
    assert str(fx.partition_file) in msg and "999999.jpg" in msg


def test_celeba_missing_image(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    (fx.image_dir / fx.names[3]).unlink()
    msg = _load_error("celeba", tmp_path)
    assert str(fx.image_dir / fx.names[3]) in msg and "missing" in msg


def test_celeba_truncated_jpeg(tmp_path):
    fx = write_celeba(tmp_path, n=10)
    path = fx.image_dir / fx.names[7]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    msg = _load_error("celeba", tmp_path)
    assert str(path) in msg and "truncated" in msg


@pytest.mark.parametrize("size", [(5000, 6000), (60_000, 60_000)], ids=["over our limit", "over PIL's limit"])
def test_celeba_decompression_bomb_is_refused_unread(tmp_path, size):
    fx = write_celeba(tmp_path, n=10)
    path = write_bomb_jpeg(fx.image_dir / fx.names[4], *size)
    assert path.stat().st_size < 2000 and size[0] * size[1] > MAX_PIXELS
    msg = _load_error("celeba", tmp_path)
    assert str(path) in msg and "decompression bomb" in msg


def test_celeba_distinct_images_fixture_links_the_rest(tmp_path):
    fx = write_celeba(tmp_path, n=12, distinct_images=5)
    assert len(list(fx.image_dir.iterdir())) == 12
    assert (fx.image_dir / fx.names[7]).read_bytes() == (fx.image_dir / fx.names[2]).read_bytes()
    check_split(read("celeba", cfg("celeba", tmp_path)).splits["train"], 8)


def test_celeba_download_failure_is_data_error(tmp_path, monkeypatch):
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError("no network")

    monkeypatch.setattr(torchvision.datasets, "CelebA", offline)
    msg = _load_error("celeba", tmp_path, download=True)
    assert "no network" in msg and str(tmp_path / "celeba") in msg


# ----------------------------------------------------------------------------------------- CIFAR


def test_carve_validation_is_fixed_disjoint_and_complete():
    train, val = carve_validation(100, 0.2)
    assert len(val) == 20 and len(train) == 80
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(100))
    assert np.array_equal(val, carve_validation(100, 0.2)[1])


def test_cifar10_reads_fixture(tmp_path):
    folder = write_cifar10(tmp_path, n_train_per_batch=20, n_test=30)
    data = read("cifar10", cfg("cifar10", tmp_path))
    assert data.spec.task_names == ("class",) and data.spec.num_classes == (10,)
    assert data.spec.pad_crop == 4 and data.spec.hflip
    for split, size in (("train", 80), ("val", 20), ("test", 30)):  # 20 % of 100 is validation
        check_split(data.splits[split], size)
        labels = data.splits[split].labels
        assert labels.shape[1] == 1 and 0 <= labels.min() and labels.max() < 10
    # channel-major rows: the test split is the official test batch, unchanged
    with open(folder / "test_batch", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert np.array_equal(data.splits["test"].images.numpy(), batch[b"data"].reshape(-1, 3, 32, 32))
    assert data.splits["test"].labels[:, 0].tolist() == batch[b"labels"]


def test_cifar100_reads_fixture_resized_and_capped(tmp_path):
    write_cifar100(tmp_path, n_train=100, n_test=30)
    data = read("cifar100", cfg("cifar100", tmp_path))
    assert data.spec.num_classes == (100,)
    for split, size in (("train", 95), ("val", 5), ("test", 30)):  # 5 % of 100 is validation
        check_split(data.splits[split], size)
    small = read("cifar100", cfg("cifar100", tmp_path, image_size=16, max_samples=7))
    for split, size in (("train", 7), ("val", 5), ("test", 7)):
        check_split(small.splits[split], size, image_size=16)
        assert torch.equal(small.splits[split].labels, data.splits[split].labels[:size])


def test_cifar_missing_root(tmp_path):
    msg = _load_error("cifar10", tmp_path)
    assert str(tmp_path / "cifar-10-batches-py") in msg and "torchvision.datasets.CIFAR10" in msg


def test_cifar_batch_missing_labels(tmp_path):
    folder = write_cifar10(tmp_path, n_train_per_batch=4, n_test=4)
    path = folder / "data_batch_3"
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    del batch[b"labels"]
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    msg = _load_error("cifar10", tmp_path)
    assert str(path) in msg and "b'labels'" in msg


# ------------------------------------------------------------------------------------------ SVHN


@pytest.mark.parametrize("subfolder", [True, False])
def test_svhn_reads_fixture(tmp_path, subfolder):
    paths = write_svhn(tmp_path, n_train=50, n_test=20, subfolder=subfolder)
    data = read("svhn", cfg("svhn", tmp_path))
    assert data.spec.task_names == ("digit",) and not data.spec.hflip
    for split, size in (("train", 40), ("val", 10), ("test", 20)):
        check_split(data.splits[split], size)
        labels = data.splits[split].labels
        assert 0 <= labels.min() and labels.max() <= 9
    mat = scipy.io.loadmat(str(paths["test"]))
    expected = mat["y"][:, 0].astype(np.int64) % 10  # 10 -> 0, 1..9 unchanged
    assert (mat["y"] == 10).any() and np.array_equal(data.splits["test"].labels[:, 0].numpy(), expected)
    assert np.array_equal(data.splits["test"].images[3].numpy(), mat["X"][..., 3].transpose(2, 0, 1))
    capped = read("svhn", cfg("svhn", tmp_path, max_samples=3))
    assert [len(s) for s in capped.splits.values()] == [3, 3, 3]


def test_svhn_missing_files_names_both_places(tmp_path):
    msg = _load_error("svhn", tmp_path)
    assert str(tmp_path / "svhn" / "train_32x32.mat") in msg and str(tmp_path / "train_32x32.mat") in msg


def test_svhn_mat_missing_y(tmp_path):
    paths = write_svhn(tmp_path, n_train=10, n_test=5)
    scipy.io.savemat(str(paths["test"]), {"X": np.zeros((32, 32, 3, 5), np.uint8)})
    msg = _load_error("svhn", tmp_path)
    assert str(paths["test"]) in msg and "'y'" in msg


# ---------------------------------------------------------------------------------------- digits


def test_digits_loads():
    data = read("digits", DataConfig(task="digits", image_size=32))
    assert data.spec.pad_crop == 4 and not data.spec.hflip
    for split, size in (("train", 1078), ("val", 359), ("test", 360)):
        check_split(data.splits[split], size)
        assert 0 <= data.splits[split].labels.min() and data.splits[split].labels.max() <= 9
    images = data.splits["train"].images
    assert torch.equal(images[:, 0], images[:, 1]) and images.max() > 200
    capped = read("digits", DataConfig(task="digits", image_size=16, max_samples=10))
    check_split(capped.splits["val"], 10, image_size=16)
    assert capped.spec.mean == pytest.approx(
        read("digits", DataConfig(task="digits", image_size=16)).spec.mean
    )


# ------------------------------------------------------------------------------ the task contract


def fixture_for(name: str, root) -> DataConfig:
    """A config for each task with its fixture written (image size 16)."""
    if name == "celeba":
        write_celeba(root, n=30)
    elif name == "cifar10":
        write_cifar10(root, n_train_per_batch=8, n_test=12)
    elif name == "cifar100":
        write_cifar100(root, n_train=40, n_test=12)
    elif name == "svhn":
        write_svhn(root, n_train=30, n_test=12)
    elif name.startswith("fashion"):
        write_fashion_mnist(root, n_train=30, n_test=12)
    synthetic = SyntheticConfig(num_attributes=3, train_size=25, val_size=9, test_size=11)
    mosaic = FashionMosaicConfig(train_size=25, val_size=9, test_size=11)
    return DataConfig(task=name, root=str(root), image_size=16, synthetic=synthetic, fashion_mosaic=mosaic)


@pytest.mark.parametrize("name", ["celeba", "cifar10", "cifar100", "svhn", "digits", "synthetic", "fashion_mnist",
                                  "fashion_mosaic"])
def test_every_task_streams_blocks_whose_images_do_not_depend_on_stop(tmp_path, monkeypatch, name):
    """The contract the cache relies on: bounded blocks, consecutive rows, a capped read is a prefix."""
    data_cfg = fixture_for(name, tmp_path)
    whole = TASKS.get(name).open(data_cfg).decode()
    monkeypatch.setattr(task_api, "IMAGE_BLOCK_BYTES", 4 * 3 * 16 * 16)  # 4 images per block
    source = TASKS.get(name).open(data_cfg)
    for split_name, split in source.splits.items():
        n = len(split)
        blocks = list(split.read_blocks(n))
        assert all(b.dtype == np.uint8 and b.shape[1:] == (3, 16, 16) for b in blocks)
        assert [len(b) for b in blocks] == [min(4, n - start) for start in range(0, n, 4)]
        assert np.array_equal(np.concatenate(blocks), whole.splits[split_name].images.numpy())
        for stop in (1, 5, n - 1):
            prefix = np.concatenate(list(split.read_blocks(stop)))
            assert np.array_equal(prefix, whole.splits[split_name].images[:stop].numpy())
        assert np.array_equal(split.labels, whole.splits[split_name].labels.numpy())


def test_block_length_bounds_memory_at_every_image_size():
    for size in (8, 32, 64, 128, 512):
        assert block_length(size) * 3 * size * size <= task_api.IMAGE_BLOCK_BYTES
    assert block_length(128) == 682


def test_check_labels_names_task_row_value_and_range():
    spec = TaskSpec("toy", ("smile", "digit"), (2, 10), (0.5,) * 3, (0.2,) * 3)
    check_labels(spec, np.array([[0, 9], [1, 0]]), "here")  # in range: nothing happens
    with pytest.raises(DataError, match=r"here: task 'smile' has label 5 at row 1; its labels must lie in 0\.\.1"):
        check_labels(spec, np.array([[0, 9], [5, 0]]), "here")
    with pytest.raises(DataError, match=r"task 'digit' has label -3 at row 0.*unknown value"):
        check_labels(spec, np.array([[0, -3], [1, 0]]), "here")
    with pytest.raises(DataError, match="must be integers"):
        check_labels(spec, np.zeros((2, 2), np.float32), "here")
    with pytest.raises(DataError, match=r"\(N, 2\) matrix"):
        check_labels(spec, np.zeros((2, 3), np.int64), "here")


def test_out_of_range_labels_from_a_reader_stop_before_decoding(tmp_path, monkeypatch):
    """The check sits in the contract (TaskSource), so it holds for every task, present and future."""
    data_cfg = fixture_for("synthetic", tmp_path)
    real = task_api.SplitSource

    def with_bad_label(labels, read_blocks, true_probs=None):
        labels = labels.copy()
        labels[3, 1] = 2
        return real(labels, read_blocks, true_probs)

    monkeypatch.setattr("tasks.synthetic.SplitSource", with_bad_label)
    with pytest.raises(DataError, match=r"split 'train'.*'attr01' has label 2 at row 3"):
        TASKS.get("synthetic").open(data_cfg)
