"""The benchmarks run end to end at tiny sizes and time the library's own code (numbers are not judged here)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mtl_cog.benchmarks import step_ratio
from mtl_cog.benchmarks.cache_memory import celeba_proportions
from mtl_cog.benchmarks.common import CELEBA_SPLITS, NUM_TASKS, Workload, method_config, peak_rss_bytes
from mtl_cog.benchmarks.epoch_check import bf16_peak
from mtl_cog.cli import benchmark
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import load_config
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import ConfigError, UserError
from mtl_cog.models.network import build_network
from mtl_cog.training import step as training_step

REPO = Path(__file__).resolve().parents[1]
METHODS_DIR = CONFIGS / "methods"
TINY = Workload(backbone="cog_cnn_tiny", image_size=16, batch_size=4)

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _mlp_head_parameters(tasks: int, features: int, latent: int) -> int:
    """Per task Linear(D, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, 1 logit): TST's head, counted by hand."""
    return tasks * ((features * 3 * latent + 3 * latent) + (3 * latent * latent + latent) + (latent + 1))


def test_quick_benchmark_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "bench.json"
    benchmark.main(["--quick", "--skip", "memory,throughput", "--out", str(out)])
    result = json.loads(out.read_text())
    for key in ("cog_fc_step_ratio", "cog_ts_step_ratio", "loader_speedup", "calibrated_model_time_ratio",
                "cog_vs_posthoc_ts_time_ratio", "cog_vs_tst_time_ratio", "cog_fc_seconds", "baseline_train_seconds",
                "posthoc_ts_seconds", "tst_second_stage_seconds", "eval_seconds", "peak_rss_bytes",
                "cached_images_per_s", "torchvision_images_per_s"):
        assert _positive(result[key]), key
    assert set(result["median_step_seconds"]) == {"baseline", "cog_fc", "cog_ts"}
    assert result["step_ratio_targets"] == {"cog_fc": 1.03, "cog_ts": 1.03}
    assert result["images_per_s"]["backbone"] == "cog_cnn_tiny" and _positive(result["images_per_s"]["value"])
    assert result["jpeg_folder"]["images"] == 20 and result["eval_seconds"] < 60
    # the ratio is what it says: COG-FC over baseline + post-hoc TS + TST's second stage
    parts = result["baseline_train_seconds"] + result["posthoc_ts_seconds"] + result["tst_second_stage_seconds"]
    assert result["calibrated_model_time_ratio"] == pytest.approx(result["cog_fc_seconds"] / parts)
    cpu = result["cpu_seconds"]  # the same parts in CPU seconds (on the CPU)
    assert result["calibrated_model_cpu_time_ratio"] == pytest.approx(
        cpu["cog_fc"] / (cpu["baseline"] + cpu["posthoc_ts"] + cpu["tst_second_stage"]))
    # TST's second stage is the registered mlp head (Z from configs/methods/tst.yaml, the authors' 10) on the
    # frozen backbone
    tst = result["tst_second_stage"]
    z = load_config(METHODS_DIR / "tst.yaml").two_stage.latent_dim
    assert tst["head"] == "MLPHeads" and tst["registry_name"] == "mlp" and tst["latent_dim"] == z == 10
    cfg = method_config(METHODS_DIR, "baseline", TINY)
    features = build_network(cfg.model, cfg.method, LogitLayout((2,) * NUM_TASKS)).backbone.num_features
    expected = _mlp_head_parameters(NUM_TASKS, features, z)
    assert tst["trainable_parameters"] == {"backbone": 0, "heads": expected, "calibrator": 0, "total": expected}
    assert tst["epochs_run"] == 1 and result["setup"]["tasks"] == NUM_TASKS
    table = capsys.readouterr().out
    assert "cog_fc_step_ratio" in table and "loader_speedup" in table and "calibrated_model_time_ratio" in table
    assert "epoch" not in table  # training progress goes to stderr; stdout is the table


def test_step_ratio_times_the_library_step_for_each_named_method(monkeypatch):
    calls = {"batch_loss": 0, "apply_update": 0}
    for name in calls:
        original = getattr(training_step, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(training_step, name, counting)
    result = step_ratio.measure_step_ratios(TINY, METHODS_DIR, ["cog_fc", "cog_tst", "ls"], steps=2, warmup=1)
    assert calls == {"batch_loss": 4 * 3, "apply_update": 4 * 3}  # 4 methods (baseline added) x 3 steps
    assert list(result["median_step_seconds"]) == ["baseline", "cog_fc", "cog_tst", "ls"]
    assert result["step_ratio_targets"] == {"cog_fc": 1.03, "cog_tst": 1.10, "ls": 1.10}
    for method in ("cog_fc", "cog_tst", "ls"):
        median = result["median_step_seconds"]
        assert result[f"{method}_step_ratio"] == pytest.approx(median[method] / median["baseline"])


def test_speed_options_time_each_precision_and_layout_as_a_run_would(monkeypatch):
    from mtl_cog.benchmarks import speed_options
    from mtl_cog.training.accelerator import create_accelerator

    seen = {}  # what the first convolution of each trainee computes in: the setting must have taken effect
    original = speed_options.build_trainee

    def recording(accelerator, cfg, layout, seed=None):
        trainee = original(accelerator, cfg, layout, seed=seed)
        name = speed_options.label(cfg.train.precision, cfg.train.channels_last)
        conv = next(m for m in trainee.network.modules() if isinstance(m, torch.nn.Conv2d))
        def record(module, args, out, name=name) -> None:  # returns None: the output stays the conv's
            seen.setdefault(name, (out.dtype, args[0].is_contiguous(memory_format=torch.channels_last)))

        conv.register_forward_hook(record)
        return trainee

    monkeypatch.setattr(speed_options, "build_trainee", recording)
    result = speed_options.measure_speed_options(TINY, METHODS_DIR, steps=2, warmup=1)["speed_options"]
    names = ["fp32", "fp32+channels_last", "bf16", "bf16+channels_last"]
    assert list(result["median_step_seconds"]) == names
    assert seen == {"fp32": (torch.float32, False), "fp32+channels_last": (torch.float32, True),
                    "bf16": (torch.bfloat16, False), "bf16+channels_last": (torch.bfloat16, True)}
    median = result["median_step_seconds"]
    assert result["speedup"] == pytest.approx({n: median["fp32"] / median[n] for n in names})
    assert create_accelerator(None, "no").mixed_precision == "no"  # the next section gets its own state


def test_step_ratio_builds_each_method_from_its_config():
    cfg = method_config(METHODS_DIR, "cog_tst", TINY)
    assert cfg.model.head == "mlp" and cfg.method.leader == ["heads"]  # from the method file
    assert cfg.model.backbone == "cog_cnn_tiny" and cfg.train.batch_size == 4  # from the workload
    only_baseline = step_ratio.measure_step_ratios(TINY, METHODS_DIR, ["baseline"], steps=1, warmup=0)
    assert only_baseline["step_ratio_targets"] == {} and _positive(only_baseline["images_per_s"]["value"])
    assert not [k for k in only_baseline if k.endswith("_step_ratio")]


@pytest.mark.parametrize("argv,message", [
    (["--method", "cog_fc,no_such_method"], "unknown method 'no_such_method'.*Available: .*cog_fc"),
    (["--method", ","], "names no method"),
    (["--method", "cog_fc,cog_fc"], "names a method twice"),
    (["--skip", "steps,bogus"], "unknown section.*bogus"),
    (["--out", "/no/such/folder/bench.json"], "does not exist or is not writable"),
    (["--jpeg-images", "5"], "--jpeg-images must be >= 10"),
    (["--cache-images", "2"], "--cache-images must be >= 3"),
    (["--image-size", "4"], r"--image-size must be in \[8, 512\]"),
    (["--profile", "-1"], "--profile: expected steps >= 0"),
    (["--backbone", "resnet_5000"], "--backbone: unknown timm model 'resnet_5000'"),
    (["--throughput-backbones", "resnet18,resnt50"], "--throughput-backbones: unknown timm model 'resnt50'"),
])
def test_bad_requests_are_refused_before_measuring(monkeypatch, argv, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("measured before checking the request")

    monkeypatch.setattr(benchmark, "run_benchmark", must_not_run)
    with pytest.raises(UserError, match=message):  # argument errors come from the parser, the rest ConfigError
        benchmark.main(["--quick", *argv])


def test_out_that_is_a_folder_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(benchmark, "run_benchmark", lambda *a: pytest.fail("measured before checking --out"))
    with pytest.raises(ConfigError, match="is a folder"):
        benchmark.main(["--quick", "--out", str(tmp_path)])


def test_the_command_prints_one_error_line_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark.py"), "--quick", "--method", "nope"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: unknown method 'nope'")
    assert "Traceback" not in done.stderr


def test_celeba_proportions():
    assert celeba_proportions(sum(CELEBA_SPLITS.values())) == CELEBA_SPLITS
    for n in (3, 4, 10, 300, 1001):
        sizes = celeba_proportions(n)
        assert sum(sizes.values()) == n and min(sizes.values()) >= 1, n
    with pytest.raises(ConfigError):
        celeba_proportions(2)


def _current_rss_bytes() -> int:
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.is_file() else []:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no VmRSS line in /proc/self/status (not Linux)")


def test_peak_rss_sees_a_known_allocation():
    """The peak is at least the current resident size, which grows by a touched 256 MiB block."""
    before = _current_rss_bytes()
    block = np.ones(256 * 2**20, dtype=np.uint8)  # np.ones writes every page
    assert peak_rss_bytes() - before >= 250 * 2**20
    del block


def test_bf16_peak_lookup(monkeypatch):
    assert bf16_peak(torch.device("cpu"), None) == (None, "no GPU")
    assert bf16_peak(torch.device("cpu"), 500.0)[0] == 500.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert bf16_peak(torch.device("cuda"), None)[0] == 756.0  # the PCIe card, not the SXM one
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert bf16_peak(torch.device("cuda"), None)[0] == pytest.approx(989.4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU")
    assert bf16_peak(torch.device("cuda"), None)[0] is None


@pytest.mark.slow
def test_quick_benchmark_cache_memory_probe(tmp_path):
    out = tmp_path / "bench.json"
    benchmark.main(["--quick", "--skip", "steps,loader,calibrated,eval", "--out", str(out)])
    result = json.loads(out.read_text())
    memory = result["cache_memory"]
    assert memory["images"] == 300 and memory["images_read"] >= 300  # every image of the cache was read
    assert memory["image_bytes"] == 300 * 3 * 32 * 32
    assert _positive(memory["model_only_peak_rss_bytes"]) and memory["within_1GiB"]
    assert result["throughput"][0]["backbone"] == "cog_cnn_tiny"


def test_eval_cost_prints_the_ratio_and_where_the_time_goes(capsys):
    from mtl_cog.benchmarks import eval_cost
    from mtl_cog.errors import UserError

    result = eval_cost.main(["--samples", "300", "--repeats", "1"])
    cpu = result["eval_cpu_seconds"]
    assert set(cpu) == {"before", "selective", "all_on"} and all(_positive(v) for v in cpu.values())
    assert result["eval_all_on_ratio"] == pytest.approx(cpu["all_on"] / cpu["before"])
    out = capsys.readouterr().out
    assert "+ eval.groups + multicalibration" in out and f"eval_all_on_ratio {result['eval_all_on_ratio']:.3f}" in out
    with pytest.raises(UserError, match="--samples"):
        eval_cost.main(["--samples", "0"])
