"""Every bad input gets a clear message, exit code 2 and no traceback, through the real entry points.

Each case runs ``scripts/train_mtl.py`` or ``scripts/evaluate.py`` in process through ``run_cli``
(as ``python scripts/...`` does) on fixtures written in the official file formats, and checks the
message names what is wrong. ``test_launch.py`` checks the same path in a real subprocess.
Also here: non-finite losses, and W&B trouble that must not stop training.
It stays one file over 450 lines because its cases are tables of (input, expected message) read
as one inventory of bad input, beside ``docs/guides/failure_paths.md``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from mtl_cog.config import load_config, save_config
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.errors import NonFiniteLossError, run_cli
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.runs import rundir
from mtl_cog.runs.training_state import EpochProgress
from mtl_cog.training.step import train_one_epoch
from tasks.fixtures import write_celeba, write_cifar10, write_svhn

REPO = Path(__file__).resolve().parents[1]


@cache
def script(name: str):
    return importlib.import_module("mtl_cog.cli." + {"train_mtl": "train"}.get(name, name))


def tiny(tmp: Path, *extra: str) -> list[str]:
    return [f"output_dir={tmp / 'runs'}", "tracking=none", "train.epochs=1", "train.batch_size=32",
            "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=3", "data.synthetic.train_size=64",
            "data.synthetic.val_size=32", "data.synthetic.test_size=32", *extra]


def run_dir_with(tmp: Path, *files: str) -> Path:
    """A run folder (its marker and a valid config.yaml) holding the given (empty) files."""
    run = tmp / "runs" / "r"
    run.mkdir(parents=True)
    rundir.write_marker(run)
    save_config(load_config(None, tiny(tmp)), run / rundir.CONFIG)
    for name in files:
        (run / name).write_text("")
    return run


def over(tmp: Path, *files: str, config: bool = True) -> list[str]:
    """Arguments of a new run named ``r`` whose folder already exists (a run folder, or any folder)."""
    if config:
        run_dir_with(tmp, *files)
    else:
        (tmp / "runs" / "r").mkdir(parents=True)
        (tmp / "runs" / "r" / "notes.txt").write_text("not a run")
    return tiny(tmp, "run_name=r")


# ------------------------------------------------------------------------------ data fixtures


def celeba(tmp: Path, edit: Callable | None = None) -> list[str]:
    fx = write_celeba(tmp / "data", n=10, image_size=(40, 48))
    if edit is not None:
        edit(fx)
    return tiny(tmp, "data.task=celeba", f"data.root={tmp / 'data'}")


def _edit_line(path: Path, index: int, edit: Callable[[str], str]) -> None:
    lines = path.read_text().splitlines()
    lines[index] = edit(lines[index])
    path.write_text("\n".join(lines) + "\n")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def cifar_without_labels(tmp: Path) -> list[str]:
    import pickle

    folder = write_cifar10(tmp / "data", n_train_per_batch=4, n_test=4)
    with open(folder / "data_batch_2", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    del batch[b"labels"]
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump(batch, f)
    return tiny(tmp, "data.task=cifar10", f"data.root={tmp / 'data'}")


def cifar_with_code(tmp: Path) -> list[str]:
    """A CIFAR batch replaced by a pickle that would create ``tmp/pwned`` if it were unpickled."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp / "pwned"), "w"))

    folder = write_cifar10(tmp / "data", n_train_per_batch=4, n_test=4)
    evil = pickle.dumps({b"data": Payload(), b"labels": [0]}, protocol=2)
    pickle.loads(evil)  # the payload is live ...
    (tmp / "pwned").unlink()  # ... (the test then checks that the reader never runs it)
    (folder / "data_batch_1").write_bytes(evil)
    return tiny(tmp, "data.task=cifar10", f"data.root={tmp / 'data'}")


def svhn_without_x(tmp: Path) -> list[str]:
    paths = write_svhn(tmp / "data", n_train=10, n_test=5)
    scipy.io.savemat(str(paths["train"]), {"y": np.ones((10, 1), np.uint8)})
    return tiny(tmp, "data.task=svhn", f"data.root={tmp / 'data'}")


def yaml_file(tmp: Path, text: str) -> list[str]:
    (tmp / "c.yaml").write_text(text)
    return ["--config", str(tmp / "c.yaml"), *tiny(tmp)]


def forged_npz(tmp: Path, declared_shape: tuple[int, ...]) -> list[str]:
    """A prediction file whose logits header declares ``declared_shape`` but that stores 4 floats."""
    import io
    import zipfile

    def npy(array: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(array.dtype),
                                                      "fortran_order": False, "shape": shape or array.shape})
        return buffer.getvalue() + array.tobytes()

    with zipfile.ZipFile(tmp / "p.npz", "w") as archive:
        archive.writestr("task_names.npy", npy(np.array(["a"])))
        archive.writestr("logits/a.npy", npy(np.zeros(4, np.float32), declared_shape))
        archive.writestr("labels/a.npy", npy(np.zeros(4, np.int64)))
    return ["--predictions", str(tmp / "p.npz"), "--out", str(tmp / "m.json")]


def prediction_file(tmp: Path, logits: np.ndarray, labels: np.ndarray) -> list[str]:
    path = tmp / "p.npz"
    np.savez(path, task_names=np.array(["a"]), **{"logits/a": logits, "labels/a": labels})
    return ["--predictions", str(path), "--out", str(tmp / "m.json")]


# ------------------------------------------------------------------------------ the cases

TRAIN_CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "unknown key": (lambda t: tiny(t, "trian.epochs=3"), ["unknown config key 'trian'", "Did you mean train"]),
    "unknown nested key": (lambda t: tiny(t, "optim.leader_learning_rate=1e-5"),
                           ["unknown config key 'optim.leader_learning_rate'", "optim.leader_lr"]),
    "wrong type (int)": (lambda t: tiny(t, "train.epochs=zero"), ["train.epochs must be an integer. Got 'zero'"]),
    "wrong type (number)": (lambda t: tiny(t, "optim.follower_lr=fast"), ["optim.follower_lr must be a number"]),
    "wrong type (bool)": (lambda t: tiny(t, "model.pretrained=maybe"), ["model.pretrained must be true or false"]),
    "override without =": (lambda t: tiny(t, "train.epochs"), ["'train.epochs' must look like key=value"]),
    "leader_lr >= follower_lr": (lambda t: tiny(t, "optim.leader_lr=0.01", "optim.follower_lr=0.001"),
                                 ["optim.leader_lr (0.01) must be smaller than optim.follower_lr (0.001)"]),
    "empty list": (lambda t: tiny(t, "eval.bins=[]"), ["eval.bins must be a non-empty list"]),
    "empty string": (lambda t: tiny(t, "output_dir="), ["output_dir must not be empty"]),
    "negative batch size": (lambda t: tiny(t, "train.batch_size=-4"), ["train.batch_size must be > 0. Got -4"]),
    "negative learning rate": (lambda t: tiny(t, "optim.follower_lr=-0.1"), ["optim.follower_lr must be > 0"]),
    "zero epochs": (lambda t: tiny(t, "train.epochs=0"), ["train.epochs must be > 0. Got 0"]),
    "negative save_every_steps": (lambda t: tiny(t, "train.save_every_steps=-1"),
                                  ["train.save_every_steps must be >= 0"]),
    "unbounded process-group timeout": (lambda t: tiny(t, "train.dist_timeout_s=0"),
                                        ["train.dist_timeout_s must be between 1 and 604800 seconds"]),
    "bad nonfinite policy": (lambda t: tiny(t, "train.nonfinite=ignore"),
                             ["train.nonfinite must be 'stop' or 'skip'. Got 'ignore'"]),
    "unknown task": (lambda t: tiny(t, "data.task=celba"), ["unknown task 'celba'", "Did you mean celeba?"]),
    "unknown backbone": (lambda t: tiny(t, "model.backbone=resnet19"),
                         ["unknown timm model 'resnet19'", "Close matches: resnet18"]),
    "missing config file": (lambda t: ["--config", str(t / "nope.yaml")], ["config file not found", "nope.yaml"]),
    "missing data root": (lambda t: tiny(t, "data.task=celeba", f"data.root={t / 'nowhere'}"),
                          ["CelebA not found", "nowhere/celeba does not exist", "torchvision.datasets.CelebA"]),
    "missing CelebA image": (lambda t: celeba(t, lambda fx: (fx.image_dir / "000004.jpg").unlink()),
                             ["missing image", "000004.jpg"]),
    "truncated CelebA image": (lambda t: celeba(t, lambda fx: truncate(fx.image_dir / "000007.jpg")),
                               ["cannot decode image", "000007.jpg", "truncated"]),
    "attribute file: wrong columns": (
        lambda t: celeba(t, lambda fx: _edit_line(fx.attr_file, 5, lambda s: s.rsplit(" ", 1)[0])),
        ["list_attr_celeba.txt, line 6: expected an image name and 40 values (41 columns), got 40 columns"]),
    "attribute file: value not +-1": (
        lambda t: celeba(t, lambda fx: _edit_line(fx.attr_file, 3, lambda s: s[:-2] + " 0")),
        ["list_attr_celeba.txt, line 4: attribute 'Young' has value '0'", "must be 1 or -1"]),
    "attribute file: an attribute named twice": (
        lambda t: celeba(t, lambda fx: _edit_line(fx.attr_file, 1, lambda s: s.replace("Young", "Smiling"))),
        ["list_attr_celeba.txt, line 2: attribute name(s) ['Smiling'] appear more than once"]),
    "partition file disagrees": (
        lambda t: celeba(t, lambda fx: _edit_line(fx.partition_file, 2, lambda s: "999999.jpg 0")),
        ["list_eval_partition.txt lists '999999.jpg'", "disagree"]),
    "CIFAR batch missing key": (cifar_without_labels, ["data_batch_2: missing key b'labels'"]),
    "CIFAR batch holding code": (cifar_with_code, ["data_batch_1 as a CIFAR pickle", "refused to load io.open"]),
    "SVHN .mat missing key": (svhn_without_x, ["train_32x32.mat: missing variable 'X'"]),
    "--resume: not a run": (lambda t: ["--resume", str(t)], ["not a run folder (config.yaml is missing)"]),
    "--resume: no such folder": (lambda t: ["--resume", str(t / "gone")], ["no such folder"]),
    "--resume: finished run": (lambda t: ["--resume", str(run_dir_with(t, rundir.DONE))], ["already finished"]),
    "--resume with --config": (lambda t: ["--resume", str(run_dir_with(t)), "--config", "x.yaml"],
                               ["no --config, --overwrite or --out with it"]),
    "new run over a finished run": (lambda t: over(t, rundir.DONE), ["already holds a finished run", "--overwrite"]),
    "new run over an unfinished run": (lambda t: over(t), ["holds an unfinished run", "--resume"]),
    "new run over a folder that is not a run": (lambda t: over(t, config=False), ["is not an mtl_cog run folder"]),
    # values that used to pass the config and fail later (or train on nonsense)
    "NaN learning rate": (lambda t: tiny(t, "optim.follower_lr=.nan"), ["optim.follower_lr must be a finite number"]),
    "inf learning rate": (lambda t: tiny(t, "optim.follower_lr=inf"), ["optim.follower_lr must be a finite number"]),
    "1e38 learning rate": (lambda t: tiny(t, "optim.follower_lr=1e38"), ["optim.follower_lr must be <= 10.0"]),
    "1e400 learning rate": (lambda t: tiny(t, "optim.leader_lr=1e400"), ["optim.leader_lr must be a finite number"]),
    "NaN weight decay": (lambda t: tiny(t, "optim.weight_decay=.nan"), ["optim.weight_decay must be a finite"]),
    "negative seed": (lambda t: tiny(t, "seed=-1"), ["seed must be an integer in [0, 4294967295]"]),
    "seed 2**32": (lambda t: tiny(t, "seed=4294967296"), ["seed must be an integer in [0, 4294967295]",
                                                           "Got 4294967296"]),
    "data seed out of range": (lambda t: tiny(t, "data.synthetic.seed=-3"), ["data.synthetic.seed must be an integer"]),
    "integer beyond 64 bits": (lambda t: tiny(t, "train.epochs=99999999999999999999"),
                               ["train.epochs must be an integer that fits in 64 bits"]),
    "a billion bins": (lambda t: tiny(t, "eval.bins=[15,1000000000]"), ["eval.bins must be a non-empty list of "
                                                                       "integers in [1, 10000]"]),
    "run_name with ..": (lambda t: tiny(t, "run_name=../../x"), ["run_name '../../x' is not usable: it must be a "
                                                                 "single folder name"]),
    "absolute run_name": (lambda t: tiny(t, f"run_name={t / 'abs'}"), ["must be a single folder name"]),
    "run_name ..": (lambda t: tiny(t, "run_name=.."), ["run_name '..' is not usable: it must name a folder"]),
    "output_dir is a file": (lambda t: (t / "f").write_text("") or tiny(t, f"output_dir={t / 'f'}"),
                             [" is a file, not a folder"]),
    "output_dir under a file": (lambda t: (t / "f").write_text("") or tiny(t, f"output_dir={t / 'f' / 'runs'}"),
                                [" is a file, not a folder"]),
    "YAML alias bomb": (lambda t: yaml_file(t, "".join(
        f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]\n" for i in range(9))),
                        ["expands to more than 100000 YAML nodes through its aliases", "refused unread"]),
    "YAML recursive alias": (lambda t: yaml_file(t, "seed: &a [*a]\n"), ["an alias refers to a node that contains it"]),
    "YAML alias bomb in an override": (
        lambda t: tiny(t, "model.timm_kwargs={" + ", ".join(f"l{i}: &l{i} [" + ", ".join(
            [f"*l{i - 1}" if i else "1"] * 9) + "]" for i in range(9)) + "}"), ["expands to more than 100000"]),
    "_base_ not a file name": (lambda t: yaml_file(t, "_base_: 5\n"), ["_base_ must be a file name"]),
    "unknown timm_kwargs of a small CNN": (lambda t: tiny(t, "model.timm_kwargs={global_pool: max}"),
                                           ["model.timm_kwargs {'global_pool': 'max'} not accepted by 'cog_cnn_tiny'",
                                            "unexpected keyword argument 'global_pool'"]),
    "pretrained weights that do not exist": (lambda t: tiny(t, "model.pretrained=true"),
                                             ["timm has no pretrained weights for 'cog_cnn_tiny'"]),
}

EVALUATE_CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "prediction file: mismatched lengths": (
        lambda t: prediction_file(t, np.zeros(5, np.float32), np.zeros(4, np.int64)), ["5 logits but 4 labels"]),
    "prediction file: NaN logits": (
        lambda t: prediction_file(t, np.array([0.1, np.nan], np.float32), np.zeros(2, np.int64)),
        ["logits contain NaN or infinite values"]),
    "prediction file: labels out of range": (
        lambda t: prediction_file(t, np.zeros((3, 4), np.float32), np.array([0, 4, 1])), ["labels must be in [0, 3]"]),
    "prediction file: missing": (lambda t: ["--predictions", str(t / "no.npz"), "--out", str(t / "m.json")],
                                 ["prediction file not found"]),
    "prediction file: not npz": (lambda t: (t / "x.npz").write_text("hello") and
                                 ["--predictions", str(t / "x.npz"), "--out", str(t / "m.json")],
                                 ["x.npz is not a readable .npz file (not a zip archive)"]),
    "prediction file: pickled object array": (
        lambda t: prediction_file(t, np.array([0.5, None], dtype=object), np.zeros(2, np.int64)),
        ["key 'logits/a'", "Pickled objects are refused unread"]),
    "prediction file: string labels": (
        lambda t: prediction_file(t, np.zeros(2, np.float32), np.array(["cat", "dog"])),
        ["labels must be integers, got dtype <U3"]),
    "--run: config.yaml not YAML": (lambda t: run_dir_with(t).joinpath(rundir.CONFIG).write_text("seed: [1,") and
                                    ["--run", str(t / "runs" / "r"), "--out", str(t / "m.json")],
                                    ["config.yaml is not valid YAML"]),
    "--run: not a run": (lambda t: ["--run", str(t), "--out", str(t / "m.json")], ["is not a run folder"]),
    "prediction file: declares a huge array": (lambda t: forged_npz(t, (10**12,)), [
        "key 'logits/a' declares a (1000000000000,) float32 array (4,000,000,000,000 bytes) but the file stores 16 "
        "bytes for it"]),
    "prediction file: 0 samples": (lambda t: prediction_file(t, np.zeros(0, np.float32), np.zeros(0, np.int64)),
                                   ["task 'a' has 0 samples"]),
    "prediction file: no tasks": (lambda t: np.savez(t / "p.npz", task_names=np.array([], dtype="<U1")) or
                                  ["--predictions", str(t / "p.npz"), "--out", str(t / "m.json")],
                                  ["'task_names' is empty: the file holds no task"]),
    "prediction file: (N, 1) logits": (lambda t: prediction_file(t, np.zeros((5, 1), np.float32), np.zeros(5, int)),
                                       ["logits of shape (5, 1) describe a task with 1 class"]),
    "prediction file: a task named twice": (
        lambda t: np.savez(t / "p.npz", task_names=np.array(["a", "a"]), **{"logits/a": np.zeros(2, np.float32),
                                                                           "labels/a": np.zeros(2, int)})
        or ["--predictions", str(t / "p.npz"), "--out", str(t / "m.json")],
        ["'task_names' lists ['a'] more than once"]),
    "--bins 1000000000": (lambda t: [*prediction_file(t, np.zeros(2, np.float32), np.zeros(2, int)), "--bins",
                                     "1000000000"], ["--bins must be a non-empty list of integers in [1, 10000]"]),
    "--out is a folder": (lambda t: [*prediction_file(t, np.zeros(2, np.float32), np.zeros(2, int))[:2], "--out",
                                     str(t)], [" is a folder, not a file"]),
    "--out under a file": (lambda t: (t / "f").write_text("") or
                           [*prediction_file(t, np.zeros(2, np.float32), np.zeros(2, int))[:2], "--out",
                            str(t / "f" / "m.json")], [" is a file, not a folder"]),
}


def user_error(script_name: str, argv: list[str], capsys) -> str:
    """Run the entry point as the command line would; return its stderr after checking exit 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: script(script_name).main(argv))
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    # progress lines (e.g. a first-use data cache build) may come first; the error is the last message
    start = err.rfind("error: ")
    assert start == 0 or (start > 0 and err[start - 1] in "\r\n"), err
    return err[start:]


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_bad_input(case, tmp_path, capsys):
    make_argv, expected = TRAIN_CASES[case]
    err = user_error("train_mtl", make_argv(tmp_path), capsys)
    for fragment in expected:
        assert fragment in err, err
    if "run" not in case and "resume" not in case:  # refused before anything was written: no half-made run folder
        assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "pwned").exists()  # nothing in a data file was executed


@pytest.mark.parametrize("case", list(EVALUATE_CASES))
def test_evaluate_bad_input(case, tmp_path, capsys):
    make_argv, expected = EVALUATE_CASES[case]
    err = user_error("evaluate", make_argv(tmp_path), capsys)
    for fragment in expected:
        assert fragment in err, err


def test_good_prediction_file_passes(tmp_path, capsys):
    """The evaluate cases above fail for their fault, not for the file layout."""
    save_predictions(tmp_path / "p.npz", Predictions(["a"], [np.zeros(3, np.float32)], [np.array([0, 1, 1])]))
    metrics = script("evaluate").main(["--predictions", str(tmp_path / "p.npz"), "--out", str(tmp_path / "m.json")])
    assert metrics["mean"]["accuracy"] == pytest.approx(1 / 3)


def test_resume_with_a_changed_model_and_overwrite(tmp_path, capsys):
    train = script("train_mtl")
    run = train.main(tiny(tmp_path, "run_name=r"))
    (run / rundir.DONE).unlink()  # pretend it was killed after its last epoch
    err = user_error("train_mtl", ["--resume", str(run), "model.backbone=cog_cnn_small"], capsys)
    # refused before anything is written: the saved state was made with the other backbone
    assert "--resume cannot change model.backbone: 'cog_cnn_tiny' -> 'cog_cnn_small'" in err
    (run / rundir.DONE).write_text("")
    again = train.main([*tiny(tmp_path, "run_name=r"), "--overwrite"])  # asked for: replaced
    assert again == run and (run / rundir.DONE).read_text().startswith("best_epoch=")


def test_subprocess_user_error_has_no_traceback(tmp_path):
    """The in-process cases above go through run_cli exactly as ``python scripts/train_mtl.py`` does."""
    result = subprocess.run([sys.executable, "scripts/train_mtl.py", "--resume", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: --resume {tmp_path}: not a run folder (config.yaml is missing)."


# ------------------------------------------------------------------------------ non-finite loss


class NaNAt:
    """A loss that is NaN for the given batches (counted over calls), mean squared logits otherwise."""

    def __init__(self, bad_calls: set[int]) -> None:
        self.bad_calls, self.calls = bad_calls, 0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = logits.pow(2).mean(dim=0)
        self.calls += 1
        return loss * float("nan") if self.calls - 1 in self.bad_calls else loss


def _engine_parts():
    from accelerate import Accelerator

    from mtl_cog.data.batches import BatchTransform

    torch.manual_seed(0)
    spec = TaskSpec("t", ("a",), (2,), (0.5,) * 3, (0.2,) * 3)
    split = SplitData(torch.randint(0, 255, (40, 3, 8, 8), dtype=torch.uint8), torch.zeros(40, 1, dtype=torch.long))
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 1))
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
    return Accelerator(cpu=True), network, optimizer, split, BatchTransform(spec, train=True)


def test_nonfinite_loss_stops_naming_epoch_and_step():
    accelerator, network, optimizer, split, transform = _engine_parts()
    saves: list[EpochProgress] = []
    with pytest.raises(NonFiniteLossError, match=r"epoch 3, step 4 of 5\. Training stopped"):
        train_one_epoch(accelerator, network, NaNAt({3}), optimizer, split, transform, 8, 0, 3,
                        check_every=50, save_every=2, on_save=saves.append)
    assert [s.step for s in saves] == [2]  # the save after the bad step 4 never happened


def test_nonfinite_loss_skip_counts_and_does_not_update():
    accelerator, network, optimizer, split, transform = _engine_parts()
    objective = NaNAt({1, 3})
    stats = train_one_epoch(accelerator, network, objective, optimizer, split, transform, 8, 0, 1, nonfinite="skip")
    assert stats["skipped"] == 2 and stats["steps"] == 3 and np.isfinite(stats["loss"])
    assert all(torch.isfinite(p).all() for p in network.parameters())


@pytest.mark.slow
def test_nonfinite_skip_agrees_across_processes(launch_two_processes):
    """NaN on one of two processes: both skip that batch, no hang, weights stay finite and identical."""
    lines = launch_two_processes("launch_nonfinite_skip.py")
    assert lines == ["0 6 2 True True", "1 6 2 True True"]  # 8 batches: 6 trained, 2 skipped on both


def test_nonfinite_loss_stops_the_script(tmp_path, capsys, monkeypatch):
    """A loss that turns NaN at its second batch (learning rates that diverge are refused by the config now)."""
    import mtl_cog.training.trainee as trainee  # build_trainee builds the objective for fit

    build = trainee.build_objective

    def nan_from_second_batch(layout, method_cfg):
        objective, calls = build(layout, method_cfg), []

        def loss(logits, labels):
            calls.append(1)
            value = objective(logits, labels)
            return value * float("nan") if len(calls) >= 2 else value
        return loss

    monkeypatch.setattr(trainee, "build_objective", lambda *a: _AsModule(nan_from_second_batch(*a)))
    err = user_error("train_mtl", tiny(tmp_path, "train.log_every_steps=1"), capsys)
    assert "non-finite training loss at epoch 1, step 2" in err and "--resume" in err


class _AsModule(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, logits, labels):
        return self.function(logits, labels)


# ------------------------------------------------------------------------------ W&B trouble


def test_wandb_failure_falls_back_to_offline(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from mtl_cog.runs import tracking
    from mtl_cog.runs.tracking import Tracker

    calls = []

    def init_trackers(project, config=None, init_kwargs=None):
        calls.append((os.environ.get("WANDB_MODE"), init_kwargs["wandb"].get("mode")))
        if len(calls) == 1:
            raise ConnectionError("api.wandb.ai unreachable")

    accelerator = Accelerator(cpu=True)
    monkeypatch.setattr(accelerator, "log_with", ["wandb"])
    monkeypatch.setattr(accelerator, "init_trackers", init_trackers)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setattr(tracking, "offline_reason", lambda: None)  # the server answered the reachability check
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(accelerator, tmp_path, "p", "r", {})
    assert tracker.enabled and calls == [("online", None), ("online", "offline")]  # the retry asks W&B for offline
    assert any("retrying offline" in str(w.message) for w in caught)
    run_id = (tmp_path / "wandb_run_id").read_text()
    assert Tracker(accelerator, tmp_path, "p", "r", {}) and (tmp_path / "wandb_run_id").read_text() == run_id


@pytest.mark.slow
def test_wandb_unreachable_never_stops_training(tmp_path):
    """W&B online against a dead loopback port with a bogus key: the server is found unreachable before W&B starts
    (W&B alone would retry for 90 s), one stdout line says so and where the offline run is; training finishes."""
    env = {**os.environ, "WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_INIT_TIMEOUT": "3", "WANDB_SILENT": "true"}
    argv = [a for a in tiny(tmp_path, "run_name=w") if a != "tracking=none"]
    result = subprocess.run([sys.executable, "scripts/train_mtl.py", *argv], cwd=REPO, capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if line.startswith("W&B")]
    assert len(said) == 1 and "W&B offline (the W&B server http://127.0.0.1:9 cannot be reached" in said[0], said
    assert "wandb sync" in said[0] and "Traceback" not in result.stderr
    run = tmp_path / "runs" / "w"
    assert (run / rundir.DONE).exists() and any((run / "wandb").glob("offline-run-*"))
