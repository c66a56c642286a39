"""W&B tracking checked on what W&B wrote to disk (tests/wandb_offline.py), never with a network.

Every W&B server here is on 127.0.0.1: a closed port (nothing listens), or a listener that
accepts connections and never answers (a firewall that lets the connection through, a hung
server). W&B's own settings are read once per process, so tests that need W&B to try "online"
run in a subprocess with their own environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from wandb_offline import offline_runs

from mtl_cog.config import load_config
from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.metrics import metric_names
from mtl_cog.runs import rundir
from mtl_cog.runs.metrics_log import wandb_row
from mtl_cog.runs.tracking import WANDB_ID, Tracker, log_with
from mtl_cog.training.accelerator import create_accelerator

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "scripts" / "train_mtl.py")]

# A Tracker as fit uses it: two epochs, the final summary, finish.
TRACKER_SCRIPT = """
import json, sys, warnings
from pathlib import Path
from mtl_cog.runs.tracking import Tracker, log_with
from mtl_cog.training.accelerator import create_accelerator
run_dir = Path(sys.argv[1])
run_dir.mkdir(parents=True, exist_ok=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tracker = Tracker(create_accelerator(log_with("wandb")), run_dir, "mtl_cog-test", "net", {"seed": 0},
                      group="sweep-x", job_type="sweep")
    for epoch in (1, 2):
        tracker.log_epoch(epoch, {"x": epoch}, {"a/val/nll": 1.0 / epoch})
    tracker.log_final({"epoch": 3, "final": True}, {"a/test/nll": 0.25})
    tracker.finish()
print(json.dumps({"enabled": tracker.enabled, "warnings": [str(w.message) for w in caught]}))
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment for a subprocess with a W&B service of its own.

    A process that used W&B leaves WANDB_SERVICE in its environment, and a child inheriting it
    attaches to the parent's W&B service: killing the child would then not kill its W&B writer.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SERVICE", "WANDB_MODE")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _online_env(base_url: str, **extra: str) -> dict[str, str]:
    """W&B with credentials and no WANDB_MODE: it tries ``base_url`` (always on this machine)."""
    return _env(WANDB_API_KEY="f" * 40, WANDB_BASE_URL=base_url, WANDB_ERROR_REPORTING="false", WANDB_SILENT="true",
                PYTHONPATH=str(REPO), **extra)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving: nothing listens there


def _run_tracker(run_dir: Path, env: dict[str, str]) -> dict:
    result = subprocess.run([sys.executable, "-c", TRACKER_SCRIPT, str(run_dir)], env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "stdout": result.stdout}


def _assert_one_complete_offline_run(run_dir: Path) -> None:
    (run,) = offline_runs(run_dir)
    assert run.exited and run.run.run_id == (run_dir / WANDB_ID).read_text().strip()
    assert run.run.run_group == "sweep-x" and run.run.job_type == "sweep"
    assert run.steps == [1, 2] and [row["a/val/nll"] for row in run.history] == [1.0, 0.5]
    assert run.summary["a/test/nll"] == 0.25
    assert not list((run_dir / "wandb").glob("run-*")), "a failed online attempt left a folder wandb sync would read"


def test_an_unreachable_server_means_offline_at_once(tmp_path):
    # W&B alone would retry for its init_timeout (here 600 s, past the subprocess timeout) and then fail
    out = _run_tracker(tmp_path / "run", _online_env(f"http://127.0.0.1:{_closed_port()}", WANDB_INIT_TIMEOUT="600"))
    assert out["enabled"] and "cannot be reached" in out["stdout"] and "wandb sync" in out["stdout"]
    _assert_one_complete_offline_run(tmp_path / "run")


@pytest.mark.slow  # W&B's online attempt runs into its (shortened) init timeout first
def test_a_failed_online_start_writes_a_real_offline_run_with_the_same_id(tmp_path):
    """Before: the retry failed with "run ID ... is in use" after ~90 s and nothing was written."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted = []  # kept open and never answered: a server that hangs
    threading.Thread(target=lambda: [accepted.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
    try:
        out = _run_tracker(tmp_path / "run", _online_env(f"http://127.0.0.1:{server.getsockname()[1]}",
                                                         WANDB_INIT_TIMEOUT="3"))
    finally:
        server.close()
    assert out["enabled"]
    assert any("W&B could not start" in w and "retrying offline" in w for w in out["warnings"]), out["warnings"]
    assert not any("in use" in w for w in out["warnings"])
    _assert_one_complete_offline_run(tmp_path / "run")


def test_rows_w_and_b_has_are_not_logged_again_and_missing_ones_are(tmp_path):
    tracker = Tracker(create_accelerator(log_with("wandb")), tmp_path, "mtl_cog-test", "replay", {"seed": 0})
    first = {1: {"a/val/nll": 0.9}, 2: {"a/val/nll": 0.8}}
    tracker.replay(first)
    tracker.log_epoch(3, {"x": 3}, {"a/val/nll": 0.7})
    tracker.replay({**{e: {"a/val/nll": -1.0} for e in (1, 2, 3)}, 4: {"a/val/nll": 0.6}})
    tracker.finish()
    (run,) = offline_runs(tmp_path)
    assert run.steps == [1, 2, 3, 4]
    assert [row["a/val/nll"] for row in run.history] == [0.9, 0.8, 0.7, 0.6]
    assert [json.loads(line)["epoch"] for line in (tmp_path / rundir.METRICS).read_text().splitlines()] == [3]


def test_empty_group_or_job_type_is_refused():
    for key in ("wandb_group", "wandb_job_type"):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [f"{key}=' '"])


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([*TRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                            env=_env(WANDB_MODE="offline"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow  # a training in a subprocess (W&B offline)
def test_a_celeba_shaped_run_puts_final_metrics_in_the_summary_and_keeps_per_attribute_sections(tmp_path):
    """40 binary attributes: every epoch's keys per attribute, the test metrics only in the summary and table."""
    epochs = 2
    _train("--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), f"output_dir={tmp_path}",
           "run_name=celeba_shaped", "tracking=wandb", f"train.epochs={epochs}", "model.backbone=cog_cnn_tiny",
           "data.synthetic.train_size=64", "data.synthetic.val_size=32", "data.synthetic.test_size=32",
           "wandb_group=sweep-x", "wandb_job_type=sweep", cwd=tmp_path)
    run_dir = tmp_path / "celeba_shaped"
    cfg = load_config(run_dir / rundir.CONFIG)
    tasks = [f"attr{t:02d}" for t in range(40)]
    (run,) = offline_runs(run_dir)
    assert run.run.run_group == "sweep-x" and run.run.job_type == "sweep"

    # history: one row per epoch (every key of it logged at every epoch), then the end-of-run media row
    assert run.steps == [*range(1, epochs + 1), epochs + 1]
    epoch_rows, media_row = run.history[:epochs], run.history[epochs]
    names = metric_names(cfg.eval.bins)
    scalar_keys = ({f"{t}/val/{m}" for t in [*tasks, "mean"] for m in names}
                   | {f"{t}/calibrator/temperature" for t in tasks}
                   | {f"calibrator/temperature_{s}" for s in ("median", "min", "max")}
                   | {"lr/follower", "lr/leader", "train/loss"})
    assert len(scalar_keys) == 1153  # docs/guides/tracking.md: 41 x 27 + 40 + 3 + 2 + 1
    multitask_keys = {f"multitask/val/{m}" for m in ("count_ece", "pair_joint_ece")} | {
        f"multitask/val/{m}@{b}" for m in ("pooled_ece", "worst_task_ece", "p90_task_ece") for b in cfg.eval.bins}
    for row in epoch_rows:
        keys = {k for k in row if not k.startswith("_")}
        pair_keys = {k for k in keys if k.startswith("pairs/val/")}
        assert keys == scalar_keys | multitask_keys | pair_keys and len(pair_keys) == cfg.eval.joint_pairs
    assert {k for k in media_row if not k.startswith("_")} == {"test/per_task_metrics", "test/reliability",
                                                                "test/smooth_reliability", "test/count_calibration"}
    assert media_row["test/per_task_metrics"]["_type"] == "table-file"
    assert not [k for k in run.history_keys() if "/test/" in k]  # no one-point chart per test metric

    # the summary: the best network's test metrics, exactly those of test_metrics.csv
    table = pd.read_csv(run_dir / rundir.TEST_METRICS).set_index("task")
    for task in [*tasks, "mean"]:
        for metric in names:
            assert run.summary[f"{task}/test/{metric}"] == pytest.approx(table.loc[task, metric], rel=1e-9)
    assert f"best_epoch={run.summary['best_epoch']}" in (run_dir / rundir.DONE).read_text()


def _kill_when(proc: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            # a pre-empted machine: the run, W&B's service process and all others die at once
            for victim in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the test could kill it"


@pytest.mark.slow  # a run killed and resumed in subprocesses
def test_a_killed_run_resumed_offline_has_every_epoch_in_its_history(tmp_path):
    """W&B buffers an offline run in 32 KiB blocks: the killed attempt's rows never reach its file."""
    epochs = 4
    run_dir = tmp_path / "killed"
    args = ["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), f"output_dir={tmp_path}",
            "run_name=killed", "tracking=wandb", f"train.epochs={epochs}", "model.backbone=cog_cnn_tiny",
            "data.synthetic.num_attributes=5", "data.synthetic.train_size=320", "data.synthetic.val_size=50",
            "data.synthetic.test_size=37", "train.save_every_steps=0"]
    proc = subprocess.Popen([*TRAIN, *args], cwd=tmp_path, env=_env(WANDB_MODE="offline"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = run_dir / rundir.METRICS
    _kill_when(proc, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2)
    resumed = _train("--resume", str(run_dir), cwd=tmp_path)

    attempts = offline_runs(run_dir)
    assert len(attempts) == 2, ([(a.path, a.steps, a.exited) for a in attempts], resumed.stdout[-3000:],
                                resumed.stderr[-3000:])
    latest = attempts[-1]
    assert latest.steps == [*range(1, epochs + 1), epochs + 1]  # every epoch, then the media row
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for line, row in zip(lines[:epochs], latest.history):
        assert row["_step"] == line["epoch"]
        expected = wandb_row(line)
        assert {k: row[k] for k in expected} == pytest.approx(expected)  # the same numbers as metrics.jsonl


def test_the_reachability_check_is_bounded_whole_name_resolution_included(monkeypatch):
    """No network: a resolver without an answer can take longer than the connect timeout; the check cannot."""
    from mtl_cog.runs import tracking

    monkeypatch.setattr(tracking, "unreachable_reason", lambda url, timeout: time.sleep(30))
    start = time.monotonic()
    why = tracking.reachable_within("https://api.wandb.ai", timeout=0.5)
    assert time.monotonic() - start < 2 and "no answer within 0.5 s" in why


def test_wandb_mode_online_gets_the_same_check(tmp_path):
    """WANDB_MODE=online asks for online, not for W&B's 90 s of retries before the same offline fallback."""
    out = _run_tracker(tmp_path / "run", _online_env(f"http://127.0.0.1:{_closed_port()}", WANDB_INIT_TIMEOUT="600",
                                                     WANDB_MODE="online"))
    assert out["enabled"] and "cannot be reached" in out["stdout"]
    _assert_one_complete_offline_run(tmp_path / "run")
