"""The benchmark script and the GPU check run end to end at tiny sizes (numbers are not judged here)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _benchmark_module():
    return importlib.import_module("mtl_cog.cli.benchmark")


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_benchmark_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "bench.json"
    _benchmark_module().main(["--quick", "--skip", "memory,throughput", "--out", str(out)])
    result = json.loads(out.read_text())
    for key in ("cog_fc_step_ratio", "cog_ts_step_ratio", "loader_speedup", "calibrated_model_time_ratio",
                "eval_seconds", "peak_rss_bytes", "cached_images_per_s", "torchvision_images_per_s"):
        assert _positive(result[key]), key
    assert set(result["median_step_seconds"]) == {"baseline", "cog_fc", "cog_ts"}
    assert result["images_per_s"]["backbone"] == "cog_cnn_small" and _positive(result["images_per_s"]["value"])
    assert result["jpeg_folder"]["images"] == 20 and result["eval_seconds"] < 60
    table = capsys.readouterr().out
    assert "cog_fc_step_ratio" in table and "loader_speedup" in table


@pytest.mark.slow
def test_quick_benchmark_cache_memory_probe(tmp_path):
    out = tmp_path / "bench.json"
    _benchmark_module().main(["--quick", "--skip", "steps,loader,calibrated,eval", "--out", str(out)])
    result = json.loads(out.read_text())
    memory = result["cache_memory"]
    assert memory["images"] == 300 and memory["images_read"] >= 300  # every image of the cache was read
    assert memory["image_bytes"] == 300 * 3 * 32 * 32
    assert _positive(memory["model_only_peak_rss_bytes"]) and memory["within_1GiB"]
    assert result["throughput"][0]["backbone"] == "cog_cnn_tiny"


def test_bf16_peak_lookup(monkeypatch):
    module = _benchmark_module()
    import torch

    assert module.bf16_peak(torch.device("cpu"), None) == (None, "no GPU")
    assert module.bf16_peak(torch.device("cpu"), 500.0)[0] == 500.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert module.bf16_peak(torch.device("cuda"), None)[0] == 756.0  # the PCIe card, not the SXM one
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert module.bf16_peak(torch.device("cuda"), None)[0] == pytest.approx(989.4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU")
    assert module.bf16_peak(torch.device("cuda"), None)[0] is None


@pytest.mark.slow
def test_gpu_check_tiny_mode_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--tiny", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["backbone"] == "resnet101" and result["precision"] == "bf16" and result["channels_last"]
    assert result["images"] == 32 and _positive(result["epoch_seconds"]) and _positive(result["images_per_s"])
    assert _positive(result["train_flops_per_image"]) and _positive(result["achieved_tflops"])
    assert "TFLOP/s" in done.stdout
