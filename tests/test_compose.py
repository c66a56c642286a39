"""Configs composed at load time: ``--data d --method m [--config extra.yaml] key=value``, and the
generated ``configs/<data set>/<method>.yaml`` files that every documented command still names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from mtl_cog.cli import calibration_drift, train
from mtl_cog.cli.config_args import resolve_files
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import load_config
from mtl_cog.config.compose import (
    DATASETS,
    METHODS,
    available,
    base_line,
    combination_problem,
    config_files,
    problems,
    write_combinations,
)
from mtl_cog.errors import ConfigError, UserError

REPO = Path(__file__).resolve().parents[1]
COMBINATIONS = [(d, m) for d in available(CONFIGS, DATASETS) for m in available(CONFIGS, METHODS)]


def tiny_root(tmp_path: Path) -> Path:
    (tmp_path / DATASETS).mkdir()
    (tmp_path / METHODS).mkdir()
    (tmp_path / DATASETS / "digits.yaml").write_text("data:\n  task: digits\ntrain:\n  epochs: 7\n")
    (tmp_path / METHODS / "cog_ts.yaml").write_text("method:\n  name: cog_ts\n  calibrator: temperature\n"
                                                      "  leader: [calibrator]\n")
    (tmp_path / METHODS / "baseline.yaml").write_text("method:\n  name: baseline\n")
    return tmp_path


def test_every_shipped_combination_is_as_generated():
    assert problems(CONFIGS) == []
    assert len(COMBINATIONS) >= 6 * 20  # every data set x every method, fashion data sets included when added


@pytest.mark.parametrize(("dataset", "method"), COMBINATIONS, ids=lambda x: str(x))
def test_data_and_method_equal_the_combination_file(dataset, method):
    cfg = load_config(config_files(CONFIGS, dataset, method), ["train.epochs=2"])
    assert cfg == load_config(CONFIGS / dataset / f"{method}.yaml", ["train.epochs=2"])
    assert cfg.data.task == dataset or dataset not in available(CONFIGS, DATASETS)
    assert cfg.method.name == method
    path = CONFIGS / dataset / f"{method}.yaml"
    if path.read_text() == base_line(dataset, method):  # a pure combination: the parts alone give the same run
        parts = [CONFIGS / DATASETS / f"{dataset}.yaml", CONFIGS / METHODS / f"{method}.yaml"]
        assert load_config(parts, ["train.epochs=2"]) == cfg


def test_the_generator_writes_checks_and_keeps_tuned_files(tmp_path):
    root = tiny_root(tmp_path)
    assert sorted(str(p.relative_to(root)) for p in write_combinations(root)) == [
        "digits/baseline.yaml", "digits/cog_ts.yaml"]
    generated = (root / "digits" / "cog_ts.yaml").read_text()
    assert generated == "_base_: [../datasets/digits.yaml, ../methods/cog_ts.yaml]\n"
    assert problems(root) == [] and write_combinations(root) == []
    tuned = base_line("digits", "cog_ts") + "# tuned by a sweep\noptim:\n  leader_lr: 3.0e-4\n"
    (root / "digits" / "cog_ts.yaml").write_text(tuned)
    assert problems(root) == [] and write_combinations(root) == []
    assert load_config(config_files(root, "digits", "cog_ts")).optim.leader_lr == 3.0e-4
    (root / "digits" / "cog_ts.yaml").write_text(base_line("digits", "cog_ts") + "optim:\n  leader_lr: 3.0e-4\n")
    assert problems(root) == [f"{root}/digits/cog_ts.yaml adds settings to the generated line without a '#' "
                              "comment right after it saying why"]
    (root / "digits" / "baseline.yaml").write_text("_base_: [../datasets/digits.yaml]\n")  # stale: regenerated
    (root / "digits" / "cog_ts.yaml").write_text("_base_: [../methods/cog_ts.yaml]\noptim:\n  leader_lr: 1.0\n")
    with pytest.raises(ConfigError, match="holds more than a _base_ line"):  # hand-written settings: not clobbered
        write_combinations(root)
    assert (root / "digits" / "baseline.yaml").read_text() == "_base_: [../datasets/digits.yaml]\n"  # none written
    (root / "digits" / "cog_ts.yaml").unlink()
    (root / "digits" / "focal.yaml").write_text(base_line("digits", "focal"))  # its method is gone
    assert [p.name for p in write_combinations(root)] == ["baseline.yaml", "cog_ts.yaml"]
    assert problems(root) == [f"{root}/digits/focal.yaml combines no existing data set and method"]
    (root / "digits" / "focal.yaml").unlink()
    (root / "digits" / "baseline_mgda.yaml").write_text("_base_: baseline.yaml\n# another aggregator\nseed: 1\n")
    (root / "digits" / "cog_ts_x.yaml").write_text("_base_: baseline.yaml\nseed: 1\n")  # says nothing: an orphan
    assert problems(root) == [f"{root}/digits/cog_ts_x.yaml combines no existing data set and method"]


def test_without_a_combination_file_the_parts_are_composed(tmp_path):
    root = tiny_root(tmp_path)
    assert config_files(root, "digits", "cog_ts") == [root / DATASETS / "digits.yaml", root / METHODS / "cog_ts.yaml"]
    cfg = load_config(config_files(root, "digits", "cog_ts"))
    assert (cfg.data.task, cfg.train.epochs, cfg.method.calibrator) == ("digits", 7, "temperature")


def test_unknown_names_are_refused_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match=r"--data 'celba'.*Did you mean celeba\?"):
        config_files(CONFIGS, "celba", "cog_fc")
    with pytest.raises(ConfigError, match=r"--method 'cog_tz'.*Did you mean cog_ts"):
        config_files(CONFIGS, "celeba", "cog_tz")


def test_config_files_and_overrides_are_merged_in_order(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("train:\n  epochs: 3\n  batch_size: 16\n")
    second.write_text("train:\n  epochs: 4\n")
    args = train.parse_args(["--data", "celeba", "--method", "cog_ts", "--config", str(first), "--config",
                             str(second), "seed=5"])
    cfg = load_config(resolve_files(args), args.overrides)
    assert (cfg.data.task, cfg.method.name, cfg.train.epochs, cfg.train.batch_size, cfg.seed) == (
        "celeba", "cog_ts", 4, 16, 5)
    assert load_config(resolve_files(train.parse_args([]))) == load_config(CONFIGS / "synthetic" / "cog_fc.yaml")
    only_method = load_config(resolve_files(train.parse_args(["--method", "baseline"])))
    assert only_method == load_config(CONFIGS / "synthetic" / "baseline.yaml")
    with pytest.raises(UserError, match="give --config, or --data and --method"):  # no default: it must be told
        calibration_drift.parse_args([])
    drift = calibration_drift.parse_args(["--data", "digits", "--method", "ls"])
    assert load_config(resolve_files(drift, default=False)) == load_config(CONFIGS / "digits" / "ls.yaml")


def test_a_sweep_takes_data_and_method_as_its_combination_file(tmp_path):
    from mtl_cog.cli import sweep

    args = sweep.parse_args(["--data", "digits", "--method", "cog_ts", "--grid", "seed=0,1"])
    assert args.config == CONFIGS / "digits" / "cog_ts.yaml"
    with pytest.raises(UserError, match="--method and --data name the config together"):
        sweep.parse_args(["--data", "digits", "--config", "x.yaml", "--grid", "seed=0,1"])
    with pytest.raises(ConfigError, match="Did you mean digits"):
        sweep.parse_args(["--data", "digit", "--method", "cog_ts", "--grid", "seed=0,1"])


def documented_text() -> list[tuple[Path, str]]:
    paths = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("mtl_cog/**/*.py"), *REPO.glob("scripts/*"),
             *REPO.glob("configs/**/*.yaml")]
    return [(p, p.read_text().replace("\\\n", " ")) for p in paths if p.is_file()]  # joins continued lines


TRAIN = re.compile(r"(?:scripts/train_mtl\.py|mtl-cog train|mtl_cog\.cli\.main train)([^\n`\"]*)")


def train_commands() -> list[tuple[str, str]]:
    """Every concrete training command in the docs (placeholders such as <dataset>, ... or a shell variable skipped)."""
    found = []
    for path, text in documented_text():
        for match in TRAIN.finditer(text):
            rest = re.sub(r"\[[^\]]*\]", "", match.group(1).split("#")[0]).strip(" '\"")
            quoted_next = text[match.end():match.end() + 1] == '"'  # a shell-quoted argument: "configs/$ds/..."
            if match.group(1)[:1] not in ("", " ") or quoted_next or any(s in rest for s in ("<", "...", "|",
                                                                                           "--resume", "$")):
                continue
            found.append((f"{path.relative_to(REPO)}: {match.group(0).strip()}", rest))
    return found


def test_documented_commands_are_found():
    commands = {where.split(": ", 1)[1] for where, _ in train_commands()}
    assert any("--data celeba --method cog_ts --config my_cluster.yaml" in c for c in commands)
    assert any("--config configs/celeba/cog_fc.yaml data.root=/data" in c for c in commands)


@pytest.mark.parametrize(("where", "rest"), train_commands(), ids=[w for w, _ in train_commands()])
def test_every_documented_training_command_resolves(where, rest, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "my_cluster.yaml").write_text("train:\n  batch_size: 32\n")  # the README's example of an own file
    tokens = [str(tmp_path / t) if t == "my_cluster.yaml" else t for t in shlex.split(rest)]
    args = train.parse_args(tokens)
    load_config(resolve_files(args), args.overrides)


def test_every_documented_config_path_and_data_method_pair_loads():
    paths = {m for _, text in documented_text() for m in re.findall(r"--config\s+(configs/[\w/.-]+\.yaml)", text)}
    pairs = {m for _, text in documented_text() for m in re.findall(r"--data\s+(\w+)\s+--method\s+(\w+)", text)}
    assert len(paths) > 10 and ("celeba", "cog_fc") in pairs
    for path in paths:
        load_config(REPO / path)
    for dataset, method in pairs:
        load_config(config_files(CONFIGS, dataset, method))


def test_a_combination_problem_names_the_fix(tmp_path):
    assert "run scripts/generate_configs.py" in combination_problem(tmp_path / "x.yaml", "digits", "ls")
