"""``model.pretrained=true``: weights really loaded, or one clear error; never a network access in tests.

The Hugging Face Hub is switched to offline mode for every test here (the hub's own switch,
``HF_HUB_OFFLINE``), so a weight timm would download is a local-cache lookup that fails at once.
"""

import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import timm
import torch
from safetensors.torch import save_file

from mtl_cog.config import ModelConfig
from mtl_cog.errors import ConfigError
from mtl_cog.models.network import create_backbone

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def resnet18_weights(tmp_path_factory):
    """A resnet18 checkpoint (random values, ImageNet classifier included) as timm saves it."""
    model = timm.create_model("resnet18", num_classes=1000)
    path = tmp_path_factory.mktemp("weights") / "resnet18.safetensors"
    save_file(model.state_dict(), path)
    return path, model.state_dict()


def _loaded_exactly(backbone: torch.nn.Module, reference: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, reference[key]) for key, value in backbone.state_dict().items())


@pytest.mark.parametrize("backbone", ["cog_cnn_tiny", "resnet50t"])  # ours; a timm model without weights
def test_a_model_without_pretrained_weights_is_refused(backbone):
    with pytest.raises(ConfigError, match=f"timm has no pretrained weights for '{backbone}'.*pretrained=false"):
        create_backbone(ModelConfig(backbone=backbone, pretrained=True))


def test_weights_that_cannot_be_fetched_say_how_to_fetch_them_beforehand(tmp_path):
    with pytest.raises(ConfigError) as caught:
        create_backbone(ModelConfig(backbone="resnet18", pretrained=True, timm_kwargs={"cache_dir": str(tmp_path)}))
    message = str(caught.value)
    assert "\n" not in message
    assert "could not be fetched" in message
    assert "timm.create_model('resnet18', pretrained=True, cache_dir='timm_weights')" in message
    assert "model.timm_kwargs.cache_dir=" in message and "pretrained_cfg_overlay.file=" in message


def test_a_weights_file_is_loaded_exactly(resnet18_weights):
    path, reference = resnet18_weights
    backbone = create_backbone(ModelConfig(backbone="resnet18", pretrained=True,
                                           timm_kwargs={"pretrained_cfg_overlay": {"file": str(path)}}))
    assert _loaded_exactly(backbone, reference)
    assert len(backbone.state_dict()) == len(reference) - 2  # all but the dropped classifier (fc.weight, fc.bias)


def test_a_cache_dir_filled_elsewhere_is_used_offline(tmp_path, resnet18_weights):
    """The documented route: weights fetched with timm's cache_dir on a machine with internet, copied here.

    The folder is laid out as the Hugging Face Hub cache is (documented in huggingface_hub's
    "Manage the cache" guide): models--<org>--<name>/refs/main holds the revision whose
    snapshots/<revision>/ folder holds the files.
    """
    path, reference = resnet18_weights
    repo = tmp_path / f"models--timm--{timm.models.get_pretrained_cfg('resnet18').hf_hub_id.split('/')[1]}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "snapshots" / revision / "model.safetensors").write_bytes(path.read_bytes())
    backbone = create_backbone(ModelConfig(backbone="resnet18", pretrained=True,
                                           timm_kwargs={"cache_dir": str(tmp_path)}))
    assert _loaded_exactly(backbone, reference)


def test_a_missing_weights_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.safetensors"
    with pytest.raises(ConfigError, match=f"pretrained_cfg_overlay.file: no file at {missing}"):
        create_backbone(ModelConfig(backbone="resnet18", pretrained=True,
                                    timm_kwargs={"pretrained_cfg_overlay": {"file": str(missing)}}))


def test_weights_under_other_names_are_refused_not_left_random(tmp_path, resnet18_weights):
    """A wrapper's checkpoint ("model." before every name) would load nothing: timm only logs it."""
    _, reference = resnet18_weights
    wrapped = tmp_path / "lightning.safetensors"
    save_file({f"model.{k}": v for k, v in reference.items()}, wrapped)
    with pytest.raises(ConfigError, match=r"lack \d+ of the tensors of 'resnet18'.*randomly initialised"):
        create_backbone(ModelConfig(backbone="resnet18", pretrained=True,
                                    timm_kwargs={"pretrained_cfg_overlay": {"file": str(wrapped)}}))


def test_weights_of_another_shape_are_a_config_error(tmp_path, resnet18_weights):
    _, reference = resnet18_weights
    other = tmp_path / "resnet18_other_block.safetensors"
    save_file({**reference, "layer1.0.conv1.weight": torch.zeros(32, 64, 3, 3)}, other)
    with pytest.raises(ConfigError, match="could not be loaded into 'resnet18'"):
        create_backbone(ModelConfig(backbone="resnet18", pretrained=True,
                                    timm_kwargs={"pretrained_cfg_overlay": {"file": str(other)}}))


@pytest.mark.slow  # a whole training start in a subprocess
def test_training_offline_ends_with_one_error_line_and_no_run_folder(tmp_path, tiny_overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    overrides = [o for o in tiny_overrides if not o.startswith("model.backbone")]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_mtl.py"), *overrides, "model.backbone=resnet18",
         "model.pretrained=true", f"model.timm_kwargs.cache_dir={tmp_path / 'empty_cache'}", "run_name=offline"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: model.pretrained=true: the pretrained weights of 'resnet18' could not be fetched")
    assert not (tmp_path / "runs" / "offline").exists()
