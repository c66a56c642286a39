"""CPU estimates of the dry run count the measured speed options of the CPU they run on: bf16 and channels_last
sped the tiny CNN's step up on an AVX-512 BF16 CPU and bf16 slowed it 8-12x on an AVX2-only one."""

from pathlib import Path

import pytest

from mtl_cog.config import load_config
from mtl_cog.experiments import gpu_time

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("native_bf16, size, options, speed", [
    (True, 16, [], 1.0), (True, 16, ["train.precision=bf16", "train.channels_last=true"], 1.70),
    (True, 32, ["train.precision=bf16", "train.channels_last=true"], 2.16),
    (True, 28, ["train.channels_last=true"], 1.44),
    # a CPU without bf16 instructions emulates it: bf16 is far slower there, channels_last still pays
    (False, 16, [], 1.0), (False, 16, ["train.precision=bf16", "train.channels_last=true"], 0.124),
    (False, 32, ["train.precision=bf16"], 0.086), (False, 32, ["train.channels_last=true"], 1.28)])
def test_a_cpu_estimate_counts_the_measured_speed_options(monkeypatch, native_bf16, size, options, speed):
    monkeypatch.setattr(gpu_time, "cpu_has_native_bf16", lambda: native_bf16)
    cfg = load_config(REPO / "configs" / "fashion_mnist" / "baseline.yaml", [f"data.image_size={size}", *options])
    rate, source, on_cpu = gpu_time.training_rate(cfg, None)
    assert on_cpu and rate == pytest.approx(gpu_time.CPU_TINY_RATE * (16 / size) ** 2 * speed)
    assert ("speed_options" in source) == bool(options)  # the factor names where it was measured
    assert not options or ("AVX-512 BF16" if native_bf16 else "AVX2-only") in source


def test_the_speed_options_measured_on_the_tiny_cnn_are_not_applied_to_other_backbones(monkeypatch):
    monkeypatch.setattr(gpu_time, "cpu_has_native_bf16", lambda: True)
    cfg = load_config(REPO / "configs" / "fashion_mnist" / "baseline.yaml",
                      ["model.backbone=cog_cnn_small", "data.image_size=32", "train.precision=bf16",
                       "train.channels_last=true"])
    rate, source, on_cpu = gpu_time.training_rate(cfg, None)
    small_speed = gpu_time.CPU_BACKBONES["cog_cnn_small"][1]
    assert on_cpu and rate == pytest.approx(gpu_time.CPU_TINY_RATE * small_speed * (32 / 32) ** 2)
    assert "not counted" in source and "cog_cnn_tiny only" in source
