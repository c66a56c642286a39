"""Experiment tracking: W&B through Accelerate's tracker, plus local files that never depend on it.

W&B keys are ``<task>/<split>/<metric>``: W&B makes one workspace section per key prefix, so every
attribute gets its own section, and ``mean/<split>/<metric>`` holds the task average. Without
credentials W&B runs offline (the run folder then holds a ``wandb/`` run to sync later); any W&B
failure falls back to local files with a warning instead of stopping training.
"""

from __future__ import annotations

import netrc
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from mtl_cog.io import append_jsonl, atomic_write_text

WANDB_ID = "wandb_run_id"  # file in the run folder: the W&B run id, reused on --resume


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def log_with(tracking: str) -> list[str] | None:
    """The ``log_with`` argument for ``Accelerator``; sets W&B offline when it has no credentials."""
    if tracking != "wandb":
        return None
    try:
        import wandb  # noqa: F401
    except ImportError:
        warnings.warn("tracking=wandb but wandb is not installed: logging to local files only.", stacklevel=2)
        return None
    if not wandb_has_credentials() and "WANDB_MODE" not in os.environ:
        os.environ["WANDB_MODE"] = "offline"
    return ["wandb"]


def flatten_metrics(split: str, metrics: dict) -> dict[str, float]:
    """{"tasks": {t: {m: v}}, "mean": {m: v}, "multitask": {m: v}, "pairs": [...]} -> W&B keys.

    ``t/split/m`` and ``mean/split/m`` per task and task mean, ``multitask/split/m`` for the
    data-set-level metrics and ``pairs/split/<a>&<b>`` for each attribute pair's joint error
    (mtl_cog.evaluation.multitask_metrics); each prefix is its own W&B section.
    """
    flat = {f"{task}/{split}/{m}": v for task, values in metrics["tasks"].items() for m, v in values.items()}
    flat.update({f"mean/{split}/{m}": v for m, v in metrics["mean"].items()})
    flat.update({f"multitask/{split}/{m}": v for m, v in metrics.get("multitask", {}).items()})
    flat.update({f"pairs/{split}/{p['a']}&{p['b']}": p["joint_ece"] for p in metrics.get("pairs", [])})
    return flat


class Tracker:
    """Writes ``metrics.jsonl`` (one line per epoch) and forwards the same numbers to W&B.

    The W&B run id is kept in the run folder, so a resumed run continues the same W&B run.
    If W&B cannot start (no network, a bad key, a service error) it is retried offline, and if
    that fails too, only the local files are written: tracking trouble never stops training.
    """

    def __init__(self, accelerator: Accelerator, run_dir: Path, project: str, run_name: str,
                 config: dict[str, Any]) -> None:
        self.accelerator = accelerator
        self.run_dir = run_dir
        self.enabled = bool(accelerator.log_with)
        if self.enabled:
            init = {"name": run_name, "dir": str(run_dir), "id": self._run_id(), "resume": "allow"}
            try:
                accelerator.init_trackers(project, config=config, init_kwargs={"wandb": init})
            except Exception as err:  # noqa: BLE001  (network, auth, service errors: never fatal)
                self.enabled = self._start_offline(project, config, init, err)

    def _run_id(self) -> str:
        path = self.run_dir / WANDB_ID
        if self.accelerator.is_main_process and not path.exists():
            atomic_write_text(path, uuid.uuid4().hex[:16] + "\n")
        self.accelerator.wait_for_everyone()
        return path.read_text().strip()

    def _start_offline(self, project: str, config: dict[str, Any], init: dict[str, Any], err: Exception) -> bool:
        warnings.warn(f"W&B could not start ({err}); retrying offline (sync later with `wandb sync`).",
                      stacklevel=3)
        self.accelerator.trackers = []
        os.environ["WANDB_MODE"] = "offline"
        try:
            self.accelerator.init_trackers(project, config=config, init_kwargs={"wandb": {**init, "mode": "offline"}})
            return True
        except Exception as offline_err:  # noqa: BLE001
            warnings.warn(f"W&B offline failed too ({offline_err}); logging to local files only.", stacklevel=3)
            self.accelerator.trackers = []
            return False

    def log_epoch(self, epoch: int, record: dict[str, Any], flat_metrics: dict[str, float]) -> None:
        if self.accelerator.is_main_process:
            append_jsonl(self.run_dir / "metrics.jsonl", {"epoch": epoch, **record})
        if self.enabled:
            try:
                self.accelerator.log(flat_metrics, step=epoch)
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B logging failed ({err}); continuing with local files only.", stacklevel=2)
                self.enabled = False

    def finish(self) -> None:
        if self.enabled:
            try:
                self.accelerator.end_training()
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B did not finish cleanly ({err}).", stacklevel=2)
