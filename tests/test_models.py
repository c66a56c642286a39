import pytest
import torch

from mtl_cog.config import MethodConfig, ModelConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.network import build_network, create_backbone

LAYOUT = LogitLayout((2, 2, 10))


@pytest.mark.parametrize("name", CALIBRATORS.names())
def test_calibrator_is_identity_at_init(name):
    calibrator = CALIBRATORS.get(name)(LAYOUT)
    z = torch.randn(7, LAYOUT.total)
    assert torch.allclose(calibrator(z), z)


def test_temperature_divides_each_task_by_its_own_temperature():
    cal = CALIBRATORS.get("temperature")(LAYOUT)
    with torch.no_grad():
        cal.log_temperature.copy_(torch.log(torch.tensor([2.0, 4.0, 0.5])))
    z = torch.ones(1, LAYOUT.total)
    expected = torch.tensor([[0.5, 0.25] + [2.0] * 10])
    assert torch.allclose(cal(z), expected)


def test_network_output_shape_and_binary_single_logit():
    net = build_network(ModelConfig(backbone="cog_cnn_tiny"), MethodConfig(), LAYOUT)
    assert net(torch.randn(3, 3, 32, 32)).shape == (3, 1 + 1 + 10)


def test_cifar_stem_resnet_keeps_resolution():
    backbone = create_backbone(ModelConfig(backbone="resnet18", cifar_stem=True))
    assert backbone.conv1.stride == (1, 1) and backbone.conv1.kernel_size == (3, 3)
    assert isinstance(backbone.maxpool, torch.nn.Identity)
    assert backbone(torch.randn(2, 3, 32, 32)).shape == (2, 512)


def test_vit_at_32x32():
    cfg = ModelConfig(backbone="vit_tiny_patch16_224", timm_kwargs={"img_size": 32, "patch_size": 4})
    net = build_network(cfg, MethodConfig(calibrator="temperature", leader=["calibrator"]), LAYOUT)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, LAYOUT.total)


def test_unknown_backbone_lists_close_matches():
    with pytest.raises(ConfigError, match="resnet101"):
        create_backbone(ModelConfig(backbone="resnet-101"))


def test_cifar_stem_on_a_non_resnet_is_refused():
    with pytest.raises(ConfigError, match="cifar_stem"):
        create_backbone(ModelConfig(backbone="cog_cnn_tiny", cifar_stem=True))
