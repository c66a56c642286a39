"""Speed options (precision, channels_last, compile, images on device) and the fused augmentation."""

from __future__ import annotations

import pytest
import torch

from mtl_cog.config import MethodConfig, ModelConfig, TrainConfig, load_config
from mtl_cog.data.batches import crop_and_flip, place_split
from mtl_cog.data.task_api import LogitLayout, SplitData
from mtl_cog.errors import ConfigError
from mtl_cog.models.network import build_network
from mtl_cog.training.accelerator import create_accelerator
from mtl_cog.training.speed import apply_speed_options

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _windows(image: torch.Tensor, pad: int, flip: bool) -> list[torch.Tensor]:
    h, w = image.shape[-2:]
    padded = torch.nn.functional.pad(image, (pad, pad, pad, pad))
    out = [padded[:, dy:dy + h, dx:dx + w] for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)]
    return out + ([x.flip(-1) for x in out] if flip else [])


@pytest.mark.parametrize("pad,flip", [(2, True), (2, False), (0, True)])
def test_crop_and_flip_outputs_are_windows_of_the_padded_input(pad, flip):
    images = torch.randint(0, 256, (64, 3, 6, 7), dtype=torch.uint8)
    out = crop_and_flip(images, pad, flip, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    for i in range(len(images)):
        assert any(torch.equal(out[i], window) for window in _windows(images[i], pad, flip))
    if flip:  # both outcomes occur in a batch of 64 (probability of failure 2^-63)
        mirrored = [torch.equal(out[i], images[i].flip(-1)) for i in range(64)]
        if pad == 0:
            assert any(mirrored) and not all(mirrored)
    if pad:  # offsets vary across the batch
        assert len({out[i].sum().item() - images[i].sum().item() for i in range(64)}) > 1


def test_crop_and_flip_is_reproducible_from_the_generator():
    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    a = crop_and_flip(images, 2, True, torch.Generator().manual_seed(5))
    b = crop_and_flip(images, 2, True, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_place_split_on_cpu_keeps_the_mapped_tensors():
    split = SplitData(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.long))
    assert place_split(split, "cpu") is split


def _network():
    torch.manual_seed(0)
    model = ModelConfig(backbone="cog_cnn_tiny")
    return build_network(model, MethodConfig(calibrator="temperature", leader=["calibrator"]), LogitLayout((2, 2, 3)))


def test_channels_last_gives_the_same_outputs_and_gradients():
    x = torch.randn(4, 3, 16, 16)
    plain, fast = _network(), apply_speed_options(_network(), TrainConfig(channels_last=True))
    assert fast.backbone.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(plain(x), fast(x), atol=1e-5)
    plain(x).sum().backward()
    fast(x).sum().backward()
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4), name
    assert list(fast.state_dict()) == list(plain.state_dict())  # checkpoints stay interchangeable


@pytest.mark.parametrize("native, warned", [(False, True), (True, False)])
def test_bf16_on_a_cpu_without_bf16_instructions_says_it_is_slow(monkeypatch, capsys, native, warned):
    from mtl_cog.training import accelerator as module

    monkeypatch.setattr(module, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)  # CPU training, on any machine
    from accelerate.state import AcceleratorState

    module.create_accelerator(None, "bf16")
    assert (module.BF16_WITHOUT_INSTRUCTIONS in capsys.readouterr().err) == warned
    AcceleratorState._reset_state(reset_partial_state=True)
    module.create_accelerator(None, "no")  # fp32: nothing to say
    assert module.BF16_WITHOUT_INSTRUCTIONS not in capsys.readouterr().err


def test_precision_is_validated_and_bf16_runs_on_the_cpu():
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(None, ["train.precision=fp8"])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
            create_accelerator(None, "fp16")
    accelerator = create_accelerator(None, "bf16")
    assert accelerator.mixed_precision == "bf16"
    network = accelerator.prepare(_network())
    with torch.no_grad():
        inner = network.backbone(torch.randn(2, 3, 16, 16))
        out = network(torch.randn(2, 3, 16, 16))
    assert out.dtype == torch.float32  # Accelerate hands back fp32 logits to the loss
    assert inner.dtype == torch.float32  # outside the prepared forward nothing is autocast
    with accelerator.autocast():
        assert network.backbone(torch.randn(2, 3, 16, 16)).dtype == torch.bfloat16


@pytest.mark.slow
def test_compile_in_place_keeps_outputs_and_state_dict_keys():
    x = torch.randn(4, 3, 16, 16)
    plain, fast = _network(), apply_speed_options(_network(), TrainConfig(compile=True))
    assert torch.allclose(plain(x), fast(x), atol=1e-4)
    assert list(fast.state_dict()) == list(plain.state_dict())
