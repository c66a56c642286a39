import pytest

from mtl_cog.config import load_config, method_identity
from mtl_cog.errors import ConfigError

CONFIGS = "configs"


def test_defaults_validate():
    cfg = load_config(None, [])
    assert cfg.method.name == "cog_fc" and cfg.method.leader == ["heads"]


def test_yaml_bases_and_overrides(tmp_path):
    cfg = load_config(f"{CONFIGS}/synthetic/cog_ts.yaml", ["train.epochs=3", "optim.leader_lr=1e-5", "seed=7"])
    assert cfg.method.calibrator == "temperature"
    assert cfg.train.epochs == 3 and cfg.seed == 7
    assert cfg.optim.leader_lr == pytest.approx(1e-5)  # YAML reads "1e-5" as a string: accepted as a number


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.epoch=3", "train.epochs"),  # unknown key, with a suggestion
        ("nonsense=1", "unknown config key 'nonsense'"),
        ("train.epochs=three", "train.epochs must be an integer"),
        ("train.epochs=0", "train.epochs must be > 0"),
        ("optim.follower_lr=-1", "optim.follower_lr must be > 0"),
        ("optim.leader_lr=1e-2", "must be smaller than optim.follower_lr"),
        ("data.max_samples=-5", "data.max_samples"),
        ("tracking=tensorboard", "tracking must be"),
        ("method.leader=[backbone]", "method.leader"),
        ("eval.bins=[]", "eval.bins"),
        ("train", "key=value"),
        ("train.epochs.x=1", "'epochs' is a value"),
    ],
)
def test_bad_values_are_refused_with_the_key(override, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(f"{CONFIGS}/synthetic/cog_fc.yaml", [override])
    assert fragment in str(err.value)


def test_yaml_boolean_words_on_a_command_line_are_the_words(tmp_path):
    # train.precision=no is the documented way to ask for fp32; YAML 1.1 would read it as False
    cfg = load_config(f"{CONFIGS}/synthetic/cog_fc.yaml", ["train.precision=bf16", "train.precision=no"])
    assert cfg.train.precision == "no"
    assert load_config(None, ["train.channels_last=true"]).train.channels_last is True
    with pytest.raises(ConfigError, match="train.channels_last must be true or false. Got 'yes'"):
        load_config(None, ["train.channels_last=yes"])
    unquoted = tmp_path / "fp32.yaml"
    unquoted.write_text("train:\n  precision: no\n")
    with pytest.raises(ConfigError, match="quote the word"):
        load_config(unquoted)
    unquoted.write_text("train:\n  precision: 'no'\n")
    assert load_config(unquoted).train.precision == "no"


def test_leader_lr_geq_follower_allowed_explicitly():
    cfg = load_config(None, ["optim.leader_lr=1e-2", "optim.allow_leader_lr_geq_follower=true"])
    assert cfg.optim.leader_lr == 1e-2


def test_baseline_ignores_leader_lr():
    cfg = load_config(f"{CONFIGS}/synthetic/baseline.yaml", ["optim.leader_lr=1.0"])
    assert cfg.method.leader == []


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/nope.yaml")


def _experiment_configs():
    from pathlib import Path

    # hypotheses/: the claims the answer tables read (analysis/hypotheses.py), not a run's config
    return sorted(p for p in Path(CONFIGS).glob("*/*.yaml")
                  if p.parent.name not in ("datasets", "methods", "accelerate", "hypotheses"))


@pytest.mark.parametrize("path", _experiment_configs(), ids=str)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    # a config is named after the method it runs; under an aggregator <method>_<aggregator> (cog_fc+mgda)
    assert cfg.data.task == path.parent.name and method_identity(cfg.to_dict()).replace("+", "_") == path.stem
