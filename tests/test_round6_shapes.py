"""Issue 58, family 5: every reader of a file the project wrote checks its shape: a damaged device-check JSON, an
``inf`` from nvidia-smi, a garbage manifest in the audit, a page that is not UTF-8: one ``error:`` line (exit 2) or a
quiet "cannot tell", never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtl_cog.errors import UserError
from mtl_cog.experiments import device_slots, gpu_time

REPO = Path(__file__).resolve().parents[1]
GOOD_CASE = {"name": "resnet18_k1", "kind": "throughput", "baseline": True, "images_per_s": 5000.0,
             "backbone": "resnet18", "image_size": 32, "precision": "bf16", "runs_per_device": 1}


def device_check(cases) -> dict:
    return {"format": gpu_time.DEVICE_CHECK_FORMAT, "tiny": False, "device": "H100", "cases": cases}


DAMAGED = {
    "cases not a list": device_check({"a": GOOD_CASE}),
    "cases a number": device_check(3),
    "a case not a mapping": device_check(["resnet18"]),
    "a case without backbone": device_check([{k: v for k, v in GOOD_CASE.items() if k != "backbone"}]),
    "a case without image size": device_check([{k: v for k, v in GOOD_CASE.items() if k != "image_size"}]),
    "a rate as text": device_check([{**GOOD_CASE, "images_per_s": "5000"}]),
    "an image size as text": device_check([{**GOOD_CASE, "image_size": "32"}]),
    "image size 0": device_check([{**GOOD_CASE, "image_size": 0}]),
    "runs per device as text": device_check([{**GOOD_CASE, "runs_per_device": "two"}]),
    "precision not text": device_check([{**GOOD_CASE, "precision": 16}]),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_device_check_is_one_error_line_naming_the_file(tmp_path, name):
    path = tmp_path / "check.json"
    path.write_text(json.dumps(DAMAGED[name]))
    with pytest.raises(UserError, match="check.json") as err:
        gpu_time.read_device_check(path)
    assert "\n" not in str(err.value)


def test_a_whole_device_check_still_reads(tmp_path):
    path = tmp_path / "check.json"
    path.write_text(json.dumps(device_check([GOOD_CASE])))
    (rate,) = gpu_time.read_device_check(path)
    assert (rate.backbone, rate.image_size, rate.images_per_s) == ("resnet18", 32, 5000.0)


def test_a_damaged_committed_device_check_refuses_a_dry_run_in_one_line(tmp_path):
    clone = tmp_path / "clone"
    (clone / "results" / "benchmarks").mkdir(parents=True)
    (clone / "results" / "benchmarks" / "h100.json").write_text(json.dumps(DAMAGED["a rate as text"]))
    with pytest.raises(UserError, match="h100.json"):
        gpu_time.committed_rates(clone)


@pytest.mark.parametrize("answer", ["inf, inf\n", "nan, 80000\n", "1e400, 80000\n", "-5, 80000\n", "[N/A], 1\n"])
def test_an_odd_nvidia_smi_reading_is_no_reading(monkeypatch, answer):
    monkeypatch.setattr(device_slots.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=answer, stderr=""))
    assert device_slots.nvidia_smi_probe("0") is None


GARBAGE_MANIFESTS = ["[]", '{"format": "x"}', '{"files": []}', '{"files": {"runs.csv": "abc"}}',
                     '{"files": {"runs.csv": {"bytes": 3}}}', '{"files": {"../x.csv": {"sha256": "0"}}}', "\xff"]


@pytest.mark.parametrize("manifest", GARBAGE_MANIFESTS)
def test_the_audit_refuses_a_garbage_manifest_in_one_line(tmp_path, manifest):
    bundle = "results/overconfident_curve_cog_fc/bundle"
    shutil.copytree(REPO / bundle, tmp_path / bundle)
    (tmp_path / bundle / "manifest.json").write_bytes(manifest.encode("latin-1"))
    appendix = (REPO / "docs" / "results" / "overconfident_appendix.md").read_text()
    start = appendix.index(f"<!-- bundle-table: {bundle} curve_paired ")
    (tmp_path / "page.md").write_text(appendix[start:appendix.index("<!-- /bundle-table -->", start) + 22] + "\n")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "audit_claims.py"), str(tmp_path / "page.md"),
                           "--root", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not done.stdout and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "manifest.json" in done.stderr, done.stderr


def test_the_audit_reads_a_bundle_whose_specs_record_digests_alone(tmp_path):
    """Bundles written before campaign.json recorded labels (a digest per run): the audit reads their labels from
    runs.csv, as the project does, instead of stopping on the first spec."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "audit_claims.py"),
                           str(REPO / "docs" / "results" / "real_images.md")], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stdout.startswith("audited "), done.stdout + done.stderr
