"""One spelling per idea: ``--out`` where a command writes, list options that stop at a ``key=value``,
post-hoc names spelled out ("vs" is vector scaling), and a word where a calibrator's NLL misleads."""

from __future__ import annotations

import numpy as np
import pytest

from mtl_cog.cli import evaluate, leader_curve, reproduce, sweep, train
from mtl_cog.errors import UserError
from mtl_cog.evaluation.predictions import Predictions


def test_a_list_option_leaves_a_key_value_to_the_overrides():
    args = leader_curve.parse_args(["--data", "digits", "--method", "cog_fc", "--seeds", "0", "train.epochs=2",
                                    "--ratios", "0.1", "1", "seed=3"])
    assert args.seeds == [0] and args.ratios == [0.1, 1.0] and args.overrides == ["train.epochs=2", "seed=3"]


def test_overrides_between_options_keep_their_order():
    args = train.parse_args(["--data", "synthetic", "train.epochs=5", "--method", "cog_ts", "train.epochs=3"])
    assert args.method == "cog_ts" and args.overrides == ["train.epochs=5", "train.epochs=3"]  # the last one wins


def test_a_one_value_option_keeps_a_value_with_an_equals_sign():
    args = train.parse_args(["--out", "runs/a=b", "train.epochs=2"])
    assert str(args.out) == "runs/a=b" and args.overrides == ["train.epochs=2"]


def test_an_option_of_key_value_items_keeps_them():
    args = sweep.parse_args(["--data", "digits", "--method", "cog_ts", "--grid", "optim.leader_lr=1e-5,1e-4",
                             "seed=0,1"])
    assert args.grid == ["optim.leader_lr=1e-5,1e-4", "seed=0,1"] and args.overrides == []


def test_a_command_without_overrides_names_the_key_value_it_cannot_take():
    with pytest.raises(UserError, match="'train.epochs=2': this command takes no key=value overrides"):
        reproduce.parse_args(["--seeds", "0", "train.epochs=2", "--dry-run"])


def test_train_writes_where_out_says(tmp_path, capsys):
    run_dir = train.main(["--data", "synthetic", "--method", "cog_ts", "--out", str(tmp_path / "tour"),
                          "train.epochs=1", "--dry-run"])
    assert run_dir.parent == tmp_path / "tour" and not (tmp_path / "tour").exists()
    with pytest.raises(UserError, match="--out and output_dir= both"):
        train.main(["--out", str(tmp_path), f"output_dir={tmp_path}", "--dry-run"])
    with pytest.raises(UserError, match="no --config, --overwrite or --out"):
        train.main(["--resume", str(tmp_path), "--out", str(tmp_path)])


def test_posthoc_names_are_spelled_out_in_help(capsys):
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "vs (vector scaling)" in text and "ts (temperature scaling)" in text


def _binary(logits: list[float], labels: list[int]) -> Predictions:
    return Predictions(["a"], [np.asarray(logits, dtype=np.float32)], [np.asarray(labels)])


def test_isotonics_certain_mistakes_are_named_with_what_they_add_to_the_nll():
    # two of four labels given probability e^-69 the wrong way (isotonic regression's ends), two right
    note = evaluate.certain_mistakes_note("isotonic", _binary([-69.0776, 69.0776, 69.0776, 0.5], [1, 0, 1, 1]))
    assert note.startswith("note: isotonic gave 2 of 4 test labels (50.0%) probability ~0")
    assert "add about 34.54 to its NLL" in note  # 2 x 69.08 / 4
    assert evaluate.certain_mistakes_note("ts", _binary([-3.0, 3.0], [0, 1])) is None
    multiclass = Predictions(["k"], [np.asarray([[0.0, 80.0, 0.0], [80.0, 0.0, 0.0]], dtype=np.float32)],
                             [np.asarray([0, 0])])
    assert "gave 1 of 2 test labels" in evaluate.certain_mistakes_note("histogram", multiclass)
