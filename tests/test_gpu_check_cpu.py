"""The device check runs on a CPU, every case at tiny sizes with one step, so that a loan's minutes go to measuring."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtl_cog.benchmarks import device_check

REPO = Path(__file__).resolve().parents[1]


def test_the_full_check_plans_every_case_within_eight_minutes():
    planned = device_check.stages(device_check.Sizes())
    names = [case.name for stage in planned for case in stage.cases]
    assert names == ["resnet18_k1", "resnet50_k1", "resnet101_k1", "resnet101_images_on_host", "resnet101_batch512",
                     "upgrad_parameters_step_ratio", "resnet101_compile", "resnet18_k2", "resnet18_k4", "resnet18_k8",
                     "resnet101_k4"]
    assert [stage.runs for stage in planned] == [1, 2, 4, 8, 4]
    total = sum(stage.planned_seconds for stage in planned)
    assert total == pytest.approx(395.0) and total < 450 < 480  # the docstring's arithmetic, under the script's kill
    ratio = next(c for c in planned[0].cases if c.kind == "step_ratio")
    assert ratio.method == "baseline+upgrad:parameters" and ratio.workload.batch_size == 256
    single = planned[0].cases[0].workload
    assert (single.image_size, single.precision, single.channels_last, single.cifar_stem) == (32, "bf16", True, True)


def test_a_stage_that_does_not_fit_the_budget_is_skipped_and_said(tmp_path, monkeypatch):
    ran = []

    def fake_stage(stage, work, left, peak):
        ran.append(stage.name)
        return [], ""

    monkeypatch.setattr(device_check, "run_stage", fake_stage)
    result = device_check.run_check(device_check.Sizes(), tmp_path / "out.json", 42.0, None, tiny=False)
    assert ran == ["2 ResNet-18 runs side by side"]  # planned 40 s; the others 210, 45, 55 and 45 s
    assert set(result["skipped"]) == {"single runs", "4 ResNet-18 runs side by side", "8 ResNet-18 runs side by side",
                                      "4 ResNet-101 runs side by side"}
    assert "planned 210 s" in result["skipped"]["single runs"]
    assert all(case["error"] for case in result["cases"])  # no process wrote a line: each case says so
    assert json.loads((tmp_path / "out.json").read_text())["skipped"] == result["skipped"]


def test_side_by_side_runs_add_up_and_targets_are_judged_only_on_a_device():
    case = device_check.stages(device_check.Sizes())[2].cases[0]  # 4 ResNet-18 runs
    line = {"case": case.name, "case_seconds": 30.0, "device": "NVIDIA H200", "train_flops_per_image": 3e9,
            "achieved_tflops": 20.0, "fraction_of_peak": 0.02, "steps": 100, "window_seconds": 15.0,
            "warmup_seconds": 3.0, "barrier_wait_seconds": 1.0, "gpu_max_memory_allocated_bytes": 2**30,
            "gpu_max_memory_reserved_bytes": 2**31}
    merged = device_check.merge(case, [{**line, "rank": r, "images_per_s": 1000.0 * (r + 1)} for r in range(4)], True)
    assert merged["images_per_s"] == 10_000.0 and merged["per_run_images_per_s"] == [1000.0, 2000.0, 3000.0, 4000.0]
    assert merged["runs_per_device"] == 4 and merged["fraction_of_peak"] == pytest.approx(0.08)
    assert "error" in device_check.merge(case, [{**line, "rank": 0, "images_per_s": 1.0}], True)  # 3 runs missing
    cases = [{"name": "resnet18_k1", "images_per_s": 3000.0}, {**merged, "name": "resnet18_k4"}]
    assert device_check.judged_targets(cases, tiny=False)["resnet18_k4_over_k1"] == {
        "value": pytest.approx(10 / 3), "target": ">= 3", "met": True}
    assert device_check.judged_targets(cases, tiny=True)["resnet18_k4_over_k1"]["met"] is None
    assert device_check.judged_targets(cases, tiny=False)["resnet101_fraction_of_peak"]["met"] is None  # unmeasured


def test_gpu_check_tiny_runs_every_case_on_the_cpu(tmp_path):
    out = tmp_path / "device_check.json"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--tiny", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["format"] == device_check.FORMAT and result["tiny"] and not result["skipped"]
    cases = {case["name"]: case for case in result["cases"]}
    assert set(cases) == {"resnet18_k1", "resnet50_k1", "resnet101_k1", "resnet101_images_on_host",
                          "resnet101_batch512", "upgrad_parameters_step_ratio", "resnet18_k2"}
    assert not [name for name, case in cases.items() if "error" in case]
    for name, case in cases.items():
        if case["kind"] == "throughput":
            assert case["images_per_s"] > 0 and case["train_flops_per_image"] > 0, name
            assert len(case["per_run_images_per_s"]) == case["runs_per_device"] and case["steps"][0] >= 1
    assert cases["resnet18_k2"]["images_per_s"] == pytest.approx(sum(cases["resnet18_k2"]["per_run_images_per_s"]))
    assert not cases["resnet101_images_on_host"]["images_on_device"] and cases["resnet101_batch512"]["batch_size"] == 8
    ratio = cases["upgrad_parameters_step_ratio"]
    assert ratio["ratio"] > 0 and ratio["per_task_gradients"] == "one backward per task (the CPU path)"
    assert all(target["met"] is None for target in result["targets"].values())  # never judged on --tiny
    assert "resnet18_k2" in done.stdout and f"wrote {out}" in done.stdout
