"""``fashion_mnist`` and ``fashion_mosaic``: IDX files written by tasks/fixtures.py, hostile files, the real release.

It stays one file over 450 lines because the mosaic is built from Fashion-MNIST's images: both data
sets' cases read the same IDX fixtures and the same release, which a split would duplicate.
"""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mtl_cog.config import DataConfig, FashionMosaicConfig
from mtl_cog.data.cache import cache_root
from mtl_cog.data.loading import load_task
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import DataError
from tasks import fashion_mnist, fashion_mosaic
from tasks.cifar import resize_square
from tasks.fashion_mosaic import EMPTY, Layout, mosaic_labels, render, task_names_and_classes
from tasks.fixtures import write_fashion_mnist, write_idx

REAL = fashion_mnist.DEBIAN_FOLDER  # bound before any test moves the module's constant


@pytest.fixture(autouse=True)
def no_system_copy(monkeypatch, tmp_path):
    """Tests see only the files they write: the Debian folder is moved to an empty place."""
    monkeypatch.setattr(fashion_mnist, "DEBIAN_FOLDER", tmp_path / "no-debian-package")


def cfg(root, task: str = "fashion_mnist", **kw) -> DataConfig:
    return DataConfig(task=task, root=str(root), image_size=kw.pop("image_size", 28), **kw)


def mosaic_cfg(root, **kw) -> DataConfig:
    sizes = FashionMosaicConfig(train_size=30, val_size=12, test_size=16, **kw.pop("mosaic", {}))
    return cfg(root, "fashion_mosaic", image_size=kw.pop("image_size", 32), fashion_mosaic=sizes, **kw)


def read(data_cfg: DataConfig):
    return TASKS.get(data_cfg.task).open(data_cfg).decode()


# --------------------------------------------------------------------------------- fashion_mnist


@pytest.mark.parametrize("layout", ["official", "torchvision"])
@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_reads_both_layouts_gzipped_or_not(tmp_path, layout, gz):
    fx = write_fashion_mnist(tmp_path, n_train=50, n_test=20, layout=layout, gz=gz)
    data = read(cfg(tmp_path))
    assert data.spec.task_names == ("item",) and data.spec.num_classes == (10,)
    assert {k: len(v) for k, v in data.splits.items()} == {"train": 40, "val": 10, "test": 20}
    test = data.splits["test"]  # image_size 28: nothing resized, three equal channels
    assert torch.equal(test.images[:, 0], torch.from_numpy(fx.images["test"]))
    assert torch.equal(test.images[:, 2], test.images[:, 0])
    assert torch.equal(test.labels[:, 0], torch.from_numpy(fx.labels["test"].astype(np.int64)))
    # stratified: each class gives round(0.2 * 5) = 1 of its 5 training images to validation
    assert np.bincount(data.splits["val"].labels[:, 0].numpy(), minlength=10).tolist() == [1] * 10
    assert set(TASKS.get("fashion_mnist").source_files(cfg(tmp_path))) == set(fx.files.values())


def test_images_are_resized_like_the_other_small_image_tasks(tmp_path):
    fx = write_fashion_mnist(tmp_path, n_train=20, n_test=10)
    test = read(cfg(tmp_path, image_size=32)).splits["test"]
    expected = resize_square(torch.from_numpy(fx.images["test"][:, None]), 32)[:, 0]
    assert test.images.shape == (10, 3, 32, 32) and torch.equal(test.images[:, 1], expected)


def test_stratified_validation_is_fixed_disjoint_complete_and_per_class():
    labels = np.repeat(np.arange(10), 600)
    train, val = fashion_mnist.stratified_validation(labels)
    assert len(val) == 1200 and np.bincount(labels[val]).tolist() == [120] * 10
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(6000))
    assert np.array_equal(val, fashion_mnist.stratified_validation(labels)[1])
    assert not np.array_equal(val, fashion_mnist.stratified_validation(labels, seed=1)[1])


def test_split_sizes_match_the_official_release_without_reading_it():
    sizes = TASKS.get("fashion_mnist").split_sizes(DataConfig(task="fashion_mnist"))
    assert sizes == {"train": 48_000, "val": 12_000, "test": 10_000}
    assert TASKS.get("fashion_mnist").split_sizes(DataConfig(task="fashion_mnist", max_samples=7))["val"] == 7


def test_falls_back_to_the_debian_folder_when_data_root_holds_none(tmp_path, monkeypatch):
    fx = write_fashion_mnist(tmp_path / "system", n_train=20, n_test=10)
    monkeypatch.setattr(fashion_mnist, "DEBIAN_FOLDER", fx.folder)
    data = read(cfg(tmp_path / "empty-root"))
    assert len(data.splits["test"]) == 10


def test_a_copy_under_data_root_wins_over_the_debian_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_FOLDER", write_fashion_mnist(tmp_path / "system", 20, 10).folder)
    write_fashion_mnist(tmp_path / "root", n_train=30, n_test=20, layout="torchvision")
    assert len(read(cfg(tmp_path / "root")).splits["test"]) == 20


def _error(data_cfg: DataConfig) -> str:
    with pytest.raises(DataError) as info:
        TASKS.get(data_cfg.task).open(data_cfg)
    message = str(info.value)
    assert "\n" not in message, message  # one error line
    return message


def test_missing_files_name_every_place_and_both_ways_to_get_them(tmp_path):
    message = _error(cfg(tmp_path))
    assert str(tmp_path / "fashion-mnist") in message and str(tmp_path / "FashionMNIST" / "raw") in message
    assert "apt-get install dataset-fashion-mnist" in message and "data.download=true" in message


def test_a_folder_with_some_of_the_files_names_the_missing_one(tmp_path):
    fx = write_fashion_mnist(tmp_path, n_train=20, n_test=10)
    fx.files["t10k-labels-idx1-ubyte"].unlink()
    assert str(fx.folder / "t10k-labels-idx1-ubyte") in _error(cfg(tmp_path))


def _hostile(tmp_path, stem: str, damage) -> tuple[Path, DataConfig]:
    fx = write_fashion_mnist(tmp_path / "root", n_train=20, n_test=10, gz=stem.endswith(".gz"))
    path = fx.folder / stem
    damage(path)
    return path, cfg(tmp_path / "root", cache_dir=str(tmp_path / "cache"))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])


def _plain_truncated(path: Path) -> None:
    data = gzip.decompress(path.read_bytes())
    with gzip.open(path, "wb") as handle:  # a valid gzip stream holding a short IDX file
        handle.write(data[:-5])


HOSTILE = {
    "wrong magic": ("train-images-idx3-ubyte.gz",
                    lambda p: write_idx(p, np.zeros((20, 28, 28), np.uint8), magic=0x00000801),
                    "IDX magic number 0x00000801, expected 0x00000803"),
    "truncated gzip": ("t10k-images-idx3-ubyte.gz", _truncate, "cannot read"),
    "truncated IDX in gzip": ("t10k-images-idx3-ubyte.gz", _plain_truncated, "(truncated)"),
    "truncated plain": ("train-labels-idx1-ubyte", _truncate, "(truncated)"),
    "shorter than the header": ("train-labels-idx1-ubyte", lambda p: p.write_bytes(b"\x00\x00\x08"), "header"),
    "trailing bytes": ("train-labels-idx1-ubyte", lambda p: p.write_bytes(p.read_bytes() + b"\x01"), "trailing"),
    "label outside 0-9": ("t10k-labels-idx1-ubyte.gz",
                          lambda p: write_idx(p, np.array([0, 1, 2, 10, 4, 5, 6, 7, 8, 9], np.uint8)),
                          "label 10 at item 3; Fashion-MNIST labels lie in 0..9"),
    "count mismatch": ("train-labels-idx1-ubyte.gz", lambda p: write_idx(p, np.zeros(19, np.uint8)),
                       "holds 19 labels but"),
    "image sizes": ("train-images-idx3-ubyte.gz", lambda p: write_idx(p, np.zeros((20, 32, 32), np.uint8)),
                    "IDX sizes (20, 32, 32), expected (N, 28, 28)"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_damaged_file_is_one_error_naming_it_and_nothing_is_cached(tmp_path, case):
    stem, damage, expected = HOSTILE[case]
    path, data_cfg = _hostile(tmp_path, stem, damage)
    with pytest.raises(DataError) as info:
        load_task(data_cfg)  # through the cache, as a run would
    message = str(info.value)
    assert "\n" not in message and expected in message and str(path.parent) in message, message
    assert "apt-get install dataset-fashion-mnist" in message
    assert not any(p.is_dir() for p in cache_root(data_cfg).glob("*")), "a cache was left behind"


def test_the_damaged_file_is_named_not_its_partner(tmp_path):
    path, data_cfg = _hostile(tmp_path, "t10k-labels-idx1-ubyte.gz", _truncate)
    message = _error(data_cfg)
    assert str(path) in message and "t10k-images" not in message.split(" Get ")[0]


def test_a_cli_reports_a_damaged_file_as_one_error_line_exit_2(tmp_path, capsys):
    from mtl_cog.cli.prepare_data import cli

    _hostile(tmp_path, "train-labels-idx1-ubyte", _truncate)
    with pytest.raises(SystemExit) as info:
        import sys

        argv, sys.argv = sys.argv, ["prepare_data", "--task", "fashion_mnist", "--data-root", str(tmp_path / "root"),
                                    "--cache-dir", str(tmp_path / "cache")]
        try:
            cli()
        finally:
            sys.argv = argv
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert info.value.code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "train-labels-idx1-ubyte" in errors[0]


def test_download_goes_through_torchvision_into_its_layout(tmp_path, monkeypatch):
    import torchvision

    calls = []

    class FakeFashionMNIST:  # what torchvision leaves behind: <root>/FashionMNIST/raw/ with the four files
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            write_fashion_mnist(Path(root), n_train=20, n_test=10, layout="torchvision", gz=False)

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    data = read(cfg(tmp_path, download=True))
    assert calls == [(str(tmp_path), True, True), (str(tmp_path), False, True)]
    assert len(data.splits["test"]) == 10
    calls.clear()
    read(cfg(tmp_path, download=True))  # files present: no second download
    assert calls == []


def test_a_failed_download_is_one_error_line(tmp_path, monkeypatch):
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError("no network")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    message = _error(cfg(tmp_path, download=True))
    assert "no network" in message and str(tmp_path / "FashionMNIST") in message


def test_write_idx_header_is_big_endian_magic_and_sizes(tmp_path):
    path = write_idx(tmp_path / "x-idx3-ubyte", np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    data = path.read_bytes()
    assert struct.unpack(">4I", data[:16]) == (0x803, 2, 3, 4) and data[16:] == bytes(range(24))
    assert fashion_mnist.read_idx(path, 0x803, (3, 4)).tolist() == np.arange(24).reshape(2, 3, 4).tolist()


# -------------------------------------------------------------------------------- fashion_mosaic


# Hand-made pictures (tiles: top-left, top-right, bottom-left, bottom-right).
T, TR, PU, DR, CO, SA, SH, SN, BA, AB = range(10)
E = EMPTY
CONTENT = np.array([
    [SH, T, TR, SN],  # shirt and T-shirt; top above trouser; outfit
    [E, E, E, AB],  # one item, footwear only, top row empty
    [SA, SA, E, E],  # same class twice, a pair of footwear side by side
    [CO, PU, DR, BA],  # coat and pullover, dress and bag, all tiles full
    [E, E, E, E],  # nothing
])


def labels_of(name: str, heterogeneous: bool = False) -> list[int]:
    names, _ = task_names_and_classes(heterogeneous)
    return mosaic_labels(CONTENT, heterogeneous)[:, names.index(name)].tolist()


KNOWN = {
    "tile_top_left_empty": [0, 1, 0, 0, 1],
    "tile_bottom_right_footwear": [1, 1, 0, 0, 0],
    "tile_top_right_top": [1, 0, 0, 1, 0],
    "holds_shirt": [1, 0, 0, 0, 0],
    "holds_ankle_boot": [0, 1, 0, 0, 0],
    "holds_footwear": [1, 1, 1, 0, 0],
    "holds_top": [1, 0, 0, 1, 0],
    "holds_bag": [0, 0, 0, 1, 0],
    "at_most_one_item": [0, 1, 0, 0, 1],
    "exactly_two_items": [0, 0, 1, 0, 0],
    "three_or_more_items": [1, 0, 0, 1, 0],
    "all_tiles_full": [1, 0, 0, 1, 0],
    "at_least_two_tops": [1, 0, 0, 1, 0],
    "pair_of_footwear": [0, 0, 1, 0, 0],
    "same_class_twice": [0, 0, 1, 0, 0],
    "only_footwear": [0, 1, 1, 0, 0],
    "shirt_and_tshirt": [1, 0, 0, 0, 0],
    "coat_and_pullover": [0, 0, 0, 1, 0],
    "outfit": [1, 0, 0, 0, 0],
    "dress_and_bag": [0, 0, 0, 1, 0],
    "bag_and_footwear": [0, 0, 0, 0, 0],
    "top_above_trouser": [1, 0, 0, 0, 0],
    "footwear_in_bottom_row": [1, 1, 0, 0, 0],
    "top_row_empty": [0, 1, 0, 0, 1],
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_mosaic_labels_are_facts_about_the_items(name):
    assert labels_of(name) == KNOWN[name]


def test_forty_tasks_with_distinct_names_and_heterogeneous_tile_tasks():
    names, classes = task_names_and_classes(False)
    assert len(names) == 40 == len(set(names)) and set(classes) == {2}
    names_h, classes_h = task_names_and_classes(True)
    assert len(names_h) == 40 and sorted(c for c in classes_h if c != 2) == [11] * 4
    assert names_h[:4] == tuple(f"tile_{t}_item" for t in fashion_mosaic.TILES) and names_h[4:] == names[4:]
    assert labels_of("tile_top_left_item", True) == [SH, 10, SA, CO, 10]  # the class, 10 = empty
    assert labels_of("holds_top", True) == KNOWN["holds_top"]  # the binary tasks are unchanged


def test_render_places_each_resized_item_in_its_tile():
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    tiles = fashion_mosaic.tile_images(pool, 32)
    layout = Layout(content=np.array([[0, E, 1, 2]]), items=np.array([[3, -1, 0, 4]]))
    picture = render(tiles, layout, 0, 1, 32)[0]
    assert picture.shape == (3, 32, 32) and (picture[0] == picture[2]).all()
    assert (picture[0, :16, :16] == tiles[3]).all() and (picture[0, :16, 16:] == 0).all()
    assert (picture[0, 16:, :16] == tiles[0]).all() and (picture[0, 16:, 16:] == tiles[4]).all()
    assert render(tiles, layout, 0, 1, 33).shape == (1, 3, 33, 33)  # odd sizes: rendered then resized


def test_mosaic_from_fixture_sources_never_cross_splits(tmp_path, monkeypatch):
    write_fashion_mnist(tmp_path, n_train=50, n_test=20)
    seen = {}
    real = fashion_mosaic.draw_layout

    def spy(pool_labels, n, p, rng):
        layout = real(pool_labels, n, p, rng)
        seen[n] = (len(pool_labels), layout)
        return layout

    monkeypatch.setattr(fashion_mosaic, "draw_layout", spy)
    data = read(mosaic_cfg(tmp_path))
    assert {k: len(v) for k, v in data.splits.items()} == {"train": 30, "val": 12, "test": 16}
    # each split draws from its own pool: the fashion_mnist train (40) / val (10) / test (20) images
    assert {n: pool for n, (pool, _) in seen.items()} == {30: 40, 12: 10, 16: 20}
    for pool, layout in seen.values():
        used = layout.items[layout.items >= 0]
        assert used.max() < pool and np.bincount(used).max() - np.bincount(used, minlength=pool).min() <= 1
    assert data.spec.num_classes == (2,) * 40 and data.spec.mean[0] > 0


def test_mosaic_is_fixed_by_its_seed_and_the_statistics_are_exact(tmp_path):
    write_fashion_mnist(tmp_path, n_train=50, n_test=20)
    first, again = read(mosaic_cfg(tmp_path)), read(mosaic_cfg(tmp_path))
    other = read(mosaic_cfg(tmp_path, mosaic={"seed": 1}))
    for split in ("train", "val", "test"):
        assert torch.equal(first.splits[split].images, again.splits[split].images)
        assert torch.equal(first.splits[split].labels, again.splits[split].labels)
    assert not torch.equal(first.splits["train"].labels, other.splits["train"].labels)
    pixels = first.splits["train"].images.double() / 255
    assert first.spec.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-9)
    assert first.spec.std[0] == pytest.approx(pixels.std(unbiased=False).item(), abs=1e-9)


def test_mosaic_heterogeneous_labels_fit_their_class_counts_through_the_cache(tmp_path):
    write_fashion_mnist(tmp_path, n_train=50, n_test=20)
    data = load_task(mosaic_cfg(tmp_path, mosaic={"heterogeneous": True, "empty_tile_probability": 0.5}))
    assert data.spec.num_classes[:4] == (11,) * 4 and data.spec.layout.total == 36 + 44
    labels = data.splits["train"].labels
    assert labels[:, :4].max() == 10 and labels[:, 4:].max() == 1  # empty tiles exist at p = 0.5
    binary = load_task(mosaic_cfg(tmp_path, mosaic={"empty_tile_probability": 0.5}))
    assert binary.spec.num_classes == (2,) * 40  # a separate cache: the option is in the content key
    assert torch.equal(binary.splits["train"].labels[:, :4], (labels[:, :4] == 10).long())


def test_mosaic_split_sizes_and_task_count_without_reading():
    task = TASKS.get("fashion_mosaic")
    assert task.split_sizes(DataConfig(task="fashion_mosaic")) == {"train": 20_000, "val": 4_000, "test": 8_000}
    assert task.num_tasks(DataConfig(task="fashion_mosaic")) == 40


# ----------------------------------------------------------------------------------- the real files


def real_folder() -> Path:
    if not all(fashion_mnist._find_in(REAL, stem) for stem in fashion_mnist.FILES.values()):
        pytest.skip(f"the Fashion-MNIST files are not in {REAL} (apt-get install dataset-fashion-mnist)")
    return REAL


def test_the_real_release_has_its_known_counts_and_class_balance(tmp_path):
    folder = real_folder()
    official = fashion_mnist.read_official(folder)
    assert official.images["train"].shape == (60_000, 28, 28) and official.images["test"].shape == (10_000, 28, 28)
    assert np.bincount(official.labels["train"]).tolist() == [6000] * 10
    assert np.bincount(official.labels["test"]).tolist() == [1000] * 10
    assert official.images["train"].mean() / 255 == pytest.approx(fashion_mnist.MEAN, abs=5e-4)
    assert official.images["train"].std() / 255 == pytest.approx(fashion_mnist.STD, abs=5e-4)
    splits = fashion_mnist.official_splits(official)  # what open() hands on, before resizing
    assert {k: len(y) for k, (_, y) in splits.items()} == TASKS.get("fashion_mnist").split_sizes(cfg(tmp_path))
    assert np.bincount(splits["val"][1]).tolist() == [1200] * 10


@pytest.mark.slow
def test_the_real_mosaic_has_celeba_like_prevalences(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_FOLDER", real_folder())
    source = TASKS.get("fashion_mosaic").open(DataConfig(task="fashion_mosaic", root=str(tmp_path)))
    prevalence = source.splits["train"].labels.mean(axis=0)
    assert prevalence.min() <= 0.05 and prevalence.max() >= 0.40
    counts = (source.splits["test"].labels[:, :4] == 0).sum(axis=1)  # occupied tiles per picture
    assert len(np.unique(counts)) == 5  # 0..4 items: the number of positives varies


# ----------------------------------------------------------------------------------- setup script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "get_fashion_mnist.sh"


def _run_setup(tmp_path, uid: int, apt: str | None) -> tuple[subprocess.CompletedProcess, str]:
    """scripts/get_fashion_mnist.sh with stub ``id`` (and ``apt-get``: exit status ``apt``) first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if apt is not None:
        (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit {apt}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FASHION_MNIST_DIR": str(tmp_path / "absent")}
    if apt is None:  # no apt-get anywhere on PATH
        env["PATH"] = f"{bin_dir}:{_no_apt_path(tmp_path)}"
    result = subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return result, log.read_text() if log.exists() else ""


def _no_apt_path(tmp_path) -> str:
    """An empty folder: the script needs only bash built-ins and ``id`` (stubbed), and finds no apt-get."""
    folder = tmp_path / "plain"
    folder.mkdir()
    return str(folder)


@pytest.mark.parametrize("uid, apt, installs", [(0, "0", True), (0, "1", False), (1000, "0", False),
                                                (0, None, False)],
                         ids=["root with apt-get", "apt-get fails", "not root", "no apt-get"])
def test_setup_installs_the_package_as_root_or_says_how_in_one_line(tmp_path, uid, apt, installs):
    result, calls = _run_setup(tmp_path, uid, apt)
    assert result.returncode == 0, result.stderr
    if installs:
        assert result.stdout == "" and "install -y -qq dataset-fashion-mnist" in calls
    else:
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1 and "apt-get install dataset-fashion-mnist" in lines[0], result.stdout
        assert "data.download=true" in lines[0]
        assert ("update -qq" in calls) == (uid == 0 and apt == "1")  # a failed install retries once after update
    if uid != 0:
        assert calls == ""


# ------------------------------------------------------------- what the docs' tables are computed by


def test_describe_gives_prevalences_and_the_most_correlated_pairs_of_known_labels():
    from mtl_cog.data.task_api import SplitData, TaskData, TaskSpec
    from mtl_cog.reporting.data_description import correlated_pairs, describe_markdown, prevalence_rows

    # a = 1 on half; b = a (correlation +1); c = not a on the first 6 of 8, constant pattern otherwise
    a = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    c = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    k = np.array([2, 2, 2, 0, 1, 2, 0, 2])  # 3 classes, mode 2 (5 of 8)
    labels = torch.from_numpy(np.stack([a, a, c, k], axis=1))
    spec = TaskSpec("toy", ("a", "b", "c", "k"), (2, 2, 2, 3), (0.5,) * 3, (0.2,) * 3)
    split = SplitData(torch.zeros((8, 3, 4, 4), dtype=torch.uint8), labels)
    data = TaskData(spec, {"train": split, "test": split.head(4)})
    rows = {name: (kind, shares) for name, kind, shares in prevalence_rows(data)}
    assert rows["a"] == ("binary", {"train": 0.5, "test": 1.0}) and rows["c"][1]["train"] == 5 / 8
    assert rows["k"] == ("3 classes, most frequent 2", {"train": 5 / 8, "test": 3 / 4})
    pairs = correlated_pairs(data, 2)
    corr_ac = float(np.corrcoef(a, c)[0, 1])
    assert pairs[0] == ("a", "b", pytest.approx(1.0)) and pairs[1][:2] == ("a", "c")
    assert pairs[1][2] == pytest.approx(corr_ac)
    text = describe_markdown(data, 2)
    assert "mean 1.62, 5th-95th percentile 1-3, range 1-3." in text  # a+b+c per row: 2,2,2,3,1,1,1,1
    assert "| `k` | 3 classes, most frequent 2 | 62.5% | 75.0% |" in text and f"| `a` | `c` | {corr_ac:+.3f} |" in text


def test_prepare_data_describe_prints_the_tables_of_the_built_cache(tmp_path, capsys):
    from mtl_cog.cli import prepare_data

    write_fashion_mnist(tmp_path, n_train=50, n_test=20)
    prepare_data.main(["--task", "fashion_mosaic", "--data-root", str(tmp_path), "--describe", "3",
                       "data.fashion_mosaic.train_size=30", "data.fashion_mosaic.val_size=10",
                       "data.fashion_mosaic.test_size=12"])
    out = capsys.readouterr().out
    assert "| task | kind | train (n=30) | val (n=10) | test (n=12) |" in out and "| `holds_footwear` | binary |" in out
    pair_rows = [line for line in out[out.index("most correlated"):].splitlines() if line.startswith("| `")]
    assert len(pair_rows) == 3


@pytest.mark.slow  # a minute on a loaded 2-core machine (model, accelerator and cache set-up)
def test_dataset_throughput_times_the_step_on_the_real_spec(tmp_path):
    from mtl_cog.benchmarks import dataset_throughput

    write_fashion_mnist(tmp_path, n_train=50, n_test=20)
    out = tmp_path / "t.jsonl"
    results = dataset_throughput.main([
        "--config", str(Path(__file__).resolve().parents[1] / "configs" / "fashion_mosaic" / "baseline.yaml"),
        "--backbones", "cog_cnn_tiny", "--steps", "2", "--out", str(out), f"data.root={tmp_path}",
        "data.image_size=16", "data.fashion_mosaic.train_size=20", "data.fashion_mosaic.val_size=4",
        "data.fashion_mosaic.test_size=4", "data.fashion_mosaic.heterogeneous=true", "train.batch_size=8"])
    assert results[0]["dataset"] == "fashion_mosaic" and results[0]["tasks"] == 40 and results[0]["batch_size"] == 8
    assert results[0]["images_per_s"] > 0 and len(out.read_text().splitlines()) == 1


@pytest.mark.slow
def test_heterogeneous_mosaic_trains_calibrates_and_reports_end_to_end(tmp_path):
    """11-class tile tasks beside binary ones: a learned calibrator, post-hoc calibrators and the report."""
    import pandas as pd

    from mtl_cog.cli import compare, evaluate, train

    write_fashion_mnist(tmp_path / "root", n_train=60, n_test=30)
    config = Path(__file__).resolve().parents[1] / "configs" / "fashion_mosaic" / "cog_vs.yaml"
    run = train.main(["--config", str(config), f"data.root={tmp_path / 'root'}",
                      "data.fashion_mosaic.heterogeneous=true",
                      "data.fashion_mosaic.train_size=40", "data.fashion_mosaic.val_size=20",
                      "data.fashion_mosaic.test_size=30", "data.image_size=16", "train.epochs=1", "train.batch_size=16",
                      "tracking=none", f"output_dir={tmp_path / 'runs'}", "run_name=het"])
    metrics = pd.read_csv(run / "test_metrics.csv").set_index("task")
    assert metrics.loc["tile_top_left_item", "nll"] > 0
    assert np.isfinite(metrics[["nll", "brier", "ece@15"]].values).all()
    assert np.isfinite(metrics.loc["mean", "count_ece"])  # the multi-task metrics over the binary tasks
    evaluate.main(["--run", str(run), "--posthoc", "ts", "vs"])  # isotonic: 5-fold CV needs 5 per class
    posthoc = pd.read_csv(run / "posthoc_metrics.csv")
    assert set(posthoc["method"]) == {"none", "ts", "vs"}
    assert np.isfinite(posthoc[posthoc["task"] == "tile_top_left_item"][["nll", "brier"]].values).all()
    report = compare.main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    per_task = pd.read_csv(Path(report) / "per_task.csv")
    assert {"tile_top_left_item", "holds_top"} <= set(per_task["task"])


def test_the_input_blind_predictor_scores_as_computed_by_hand():
    from mtl_cog.data.task_api import SplitData, TaskData, TaskSpec
    from mtl_cog.reporting.data_description import prior_predictor_scores

    train = torch.tensor([[1, 0], [1, 1], [1, 2], [0, 2]])  # binary shares (1.5, 3.5)/5; 3 classes (1.5, 1.5, 2.5)/5.5
    test = torch.tensor([[1, 2], [0, 0]])
    spec = TaskSpec("toy", ("b", "k"), (2, 3), (0.5,) * 3, (0.2,) * 3)
    image = torch.zeros((4, 3, 4, 4), dtype=torch.uint8)
    data = TaskData(spec, {"train": SplitData(image, train), "test": SplitData(image[:2], test)})
    scores = prior_predictor_scores(data)
    p, q = 3.5 / 5, np.array([1.5, 1.5, 2.5]) / 5.5
    nll_b = -(np.log(p) + np.log(1 - p)) / 2
    nll_k = -(np.log(q[2]) + np.log(q[0])) / 2
    brier_b = (2 * (1 - p) ** 2 + 2 * p**2) / 2  # summed over both classes, as every binary Brier here
    brier_k = (((q - [0, 0, 1]) ** 2).sum() + ((q - [1, 0, 0]) ** 2).sum()) / 2
    assert scores["accuracy"] == pytest.approx((0.5 + 0.5) / 2)  # majority 1 and class 2: one right of two each
    assert scores["nll"] == pytest.approx((nll_b + nll_k) / 2)
    assert scores["brier"] == pytest.approx((brier_b + brier_k) / 2)
