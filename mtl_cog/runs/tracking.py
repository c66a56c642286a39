"""Experiment tracking: W&B through Accelerate's tracker, plus local files that never depend on it.

What W&B receives (details and the reasons in ``docs/guides/tracking.md``):

- every epoch of stage one, one history row committed at once (``commit=True``: a run killed
  after epoch e still has epoch e in W&B): ``<task>/val/<metric>`` (W&B makes one workspace
  section per key prefix, so every attribute gets its own section), ``mean/val/<metric>``,
  ``train/loss``, ``lr/<group>`` and the calibrator's values;
- at the end, the best network's validation and test metrics in the run *summary* (one number
  per key, a column of W&B's runs table; never a one-point chart at an invented step), plus the
  per-task table and the reliability figure (``mtl_cog.reporting.run_report``);
- ``group`` / ``job_type`` from the config, so the runs of one sweep or reproduction sit together.

W&B prints one line per run, not its own thirty (banner, sync hints, a history and summary of
a thousand keys sparklined on the console): it starts with ``silent=True`` unless the user set
``WANDB_SILENT`` or ``WANDB_QUIET`` (then W&B's own setting rules), and the run prints where its
data went (``where_line``): the run's page online, the ``wandb sync`` command offline.

W&B runs offline when it has no credentials or its server cannot be reached (a TCP connect,
``REACH_TIMEOUT_S``, instead of W&B's own 90 s of retries on every run of a sweep); an online
start that fails for any other reason is retried offline. Either way the run folder then holds
``wandb/offline-run-*/run-<id>.wandb``, which ``wandb sync`` uploads later; if even offline W&B
fails, only the local files are written. Tracking trouble never stops training.
"""

from __future__ import annotations

import netrc
import os
import shutil
import socket
import threading
import urllib.request
import uuid
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from accelerate import Accelerator

from mtl_cog.io import atomic_write_text
from mtl_cog.runs import rundir
from mtl_cog.runs.metrics_log import append_line
from mtl_cog.runs.rundir import WANDB_ID

REACH_TIMEOUT_S = 5.0  # a W&B server (or proxy) that does not accept a TCP connection this fast counts as unreachable


def wandb_base_url() -> str:
    """The W&B server this process would use, resolved by W&B's own rules (settings files, then WANDB_BASE_URL)."""
    import wandb

    settings = wandb.Settings(quiet=True)
    settings.update_from_system_settings()
    settings.update_from_env_vars(dict(os.environ))
    return settings.base_url


def wandb_has_credentials(base_url: str | None = None) -> bool:
    """An API key in WANDB_API_KEY or in ~/.netrc for the W&B server's host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(base_url or wandb_base_url()).hostname
    try:
        return host is not None and netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def unreachable_reason(url: str, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """Why ``url`` cannot be reached (None when a TCP connection opens), through the proxy a request would use.

    A TCP connect is what tells in milliseconds (or ``timeout``) that a compute node has no route
    to W&B; W&B itself finds out only after its ``init_timeout`` (90 s) of retries.
    """
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    if host is None:
        return f"no host in {url!r}"
    proxy = urllib.request.getproxies().get(parsed.scheme)
    if proxy and not urllib.request.proxy_bypass(host):  # behind a proxy, only the proxy must be reachable
        proxied = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxied.hostname or host, proxied.port or 8080
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:
        return f"{host}:{port}: {err}"


def reachable_within(url: str, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """``unreachable_reason`` with ``timeout`` bounding the whole check, name resolution included.

    ``socket.create_connection``'s timeout covers the connect only; a resolver that gets no answer
    (no network, a firewalled DNS server) can take its own retries first. The check runs in a
    daemon thread that is left behind if it has not answered in time.
    """
    answer: list[str | None] = []
    worker = threading.Thread(target=lambda: answer.append(unreachable_reason(url, timeout)), daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else f"no answer within {timeout:g} s (name resolution or connect)"


def offline_reason() -> str | None:
    """Why W&B must run offline in this process, or None to let W&B decide.

    WANDB_MODE=offline/disabled is followed by W&B itself. Online (WANDB_MODE unset or "online")
    needs credentials and a server that answers within ``REACH_TIMEOUT_S``; W&B alone would retry
    for its 90 s ``init_timeout`` first, in every run.
    """
    if os.environ.get("WANDB_MODE", "online") != "online":  # the user chose offline/disabled; W&B follows it
        return None
    base_url = wandb_base_url()
    if not wandb_has_credentials(base_url):
        return "no W&B credentials: WANDB_API_KEY or ~/.netrc"
    why = reachable_within(base_url)
    return None if why is None else f"the W&B server {base_url} cannot be reached ({why})"


def log_with(tracking: str) -> list[str] | None:
    """The ``log_with`` argument for ``Accelerator`` (None when tracking is off or wandb is missing)."""
    if tracking != "wandb":
        return None
    try:
        import wandb  # noqa: F401
    except ImportError:
        warnings.warn("tracking=wandb but wandb is not installed: logging to local files only.", stacklevel=2)
        return None
    return ["wandb"]


def quiet_by_default() -> bool:
    """W&B silenced (no console output of its own) unless the user chose its verbosity with its own variables."""
    return "WANDB_SILENT" not in os.environ and "WANDB_QUIET" not in os.environ


def where_line(run: Any, run_dir: Path, reason: str | None) -> str | None:
    """The one console line saying where the run's W&B data went (None when W&B is disabled)."""
    settings = getattr(run, "settings", None)  # None: no W&B run behind the tracker (nothing to say where)
    if getattr(run, "disabled", False) or settings is None or settings.mode == "disabled":
        return None
    if settings._offline:
        why = f" ({reason})" if reason else ""
        return f"W&B offline{why}; upload later with `wandb sync {run_dir / rundir.WANDB_DIR}/offline-run-*`"
    return f"W&B: {run.url}"


class Tracker:
    """Writes stage one's ``metrics.jsonl`` lines (``mtl_cog.runs.metrics_log``: one per epoch, one final
    line) and forwards the numbers to W&B.

    The W&B run id is kept in the run folder, so a resumed run continues the same W&B run
    (online: the same run; offline: a new ``offline-run-*`` folder with the same id, which
    ``wandb sync`` appends in order of start time).
    """

    def __init__(self, accelerator: Accelerator, run_dir: Path, project: str, run_name: str,
                 config: dict[str, Any], group: str | None = None, job_type: str | None = None) -> None:
        self.accelerator = accelerator
        self.run_dir = run_dir
        self.enabled = bool(accelerator.log_with)
        if not self.enabled:
            return
        init = {"name": run_name, "dir": str(run_dir), "id": self._run_id(), "resume": "allow", "group": group,
                "job_type": job_type}
        try:
            reason = offline_reason() if accelerator.is_main_process else None  # only the main process starts W&B
        except Exception as err:  # noqa: BLE001  (e.g. a malformed W&B setting: W&B's own start will say it)
            warnings.warn(f"could not check W&B's settings ({err}); trying to start W&B anyway.", stacklevel=2)
            reason = None
        if reason is not None:
            init["mode"] = "offline"
        if quiet_by_default():
            import wandb

            init["settings"] = wandb.Settings(silent=True)
        try:
            accelerator.init_trackers(project, config=config, init_kwargs={"wandb": init})
        except Exception as err:  # noqa: BLE001  (network, auth, service errors: never fatal)
            self.enabled = self._start_offline(project, config, init, err)
        if self.enabled and accelerator.is_main_process:
            line = where_line(self._wandb_run(), run_dir, reason)
            if line:
                accelerator.print(line)

    def _run_id(self) -> str:
        path = self.run_dir / WANDB_ID
        if self.accelerator.is_main_process and not path.exists():
            atomic_write_text(path, uuid.uuid4().hex[:16] + "\n")
        self.accelerator.wait_for_everyone()
        return path.read_text().strip()

    def _start_offline(self, project: str, config: dict[str, Any], init: dict[str, Any], err: Exception) -> bool:
        import wandb

        warnings.warn(f"W&B could not start ({err}); retrying offline (upload later with "
                      f"`wandb sync {self.run_dir / 'wandb'}/offline-run-*`).", stacklevel=3)
        self.accelerator.trackers = []
        # The failed start keeps the run id registered in W&B's service process, so a retry in
        # the same process fails with "run ID ... is in use": shut the service down first.
        wandb.teardown()
        # The failed online attempt's folder holds no data; left there, `wandb sync --include-online`
        # would create the run from it and the offline run would have to overwrite it.
        for attempt in (self.run_dir / rundir.WANDB_DIR).glob(f"run-*-{init['id']}"):
            if not (attempt / f"run-{init['id']}.wandb.synced").exists():
                shutil.rmtree(attempt, ignore_errors=True)
        try:
            self.accelerator.init_trackers(project, config=config, init_kwargs={"wandb": {**init, "mode": "offline"}})
            return True
        except Exception as offline_err:  # noqa: BLE001
            warnings.warn(f"W&B offline failed too ({offline_err}); logging to local files only.", stacklevel=3)
            self.accelerator.trackers = []
            return False

    def _wandb_run(self) -> Any:
        return self.accelerator.get_tracker("wandb", unwrap=True)

    def log_epoch(self, epoch: int, record: dict[str, Any], row: dict[str, float]) -> None:
        """``record`` as one ``metrics.jsonl`` line and ``row`` as the W&B history row of step ``epoch``."""
        if self.accelerator.is_main_process:
            append_line(self.run_dir / rundir.METRICS, {"epoch": epoch, **record})
        self._log_row(epoch, row)

    def replay(self, rows: dict[int, dict[str, float]]) -> None:
        """On ``--resume``: the rows of the epochs already in ``metrics.jsonl`` that this W&B run lacks.

        W&B writes an offline run to disk in 32 KiB blocks and has no flush, so a killed attempt
        loses its last rows (online, the rows still in flight); and a resumed offline run is a new
        ``offline-run-*`` folder. Logging every epoch W&B does not have yet (online: steps from
        ``run.step`` on; offline: all of them) makes the history complete in the latest attempt,
        however ``wandb sync`` combines the attempts.
        """
        for epoch in sorted(rows):
            self._log_row(epoch, rows[epoch])

    def _log_row(self, epoch: int, row: dict[str, float]) -> None:
        if not (self.enabled and self.accelerator.is_main_process):
            return
        try:
            # W&B refuses steps below run.step (the next step it expects): an epoch it already has
            # (a resumed epoch repeats the interrupted one exactly, tests/test_resume.py) is skipped.
            if epoch >= self._wandb_run().step:
                # commit=True: with an explicit step W&B would otherwise hold the row until the next one
                self.accelerator.log(row, step=epoch, log_kwargs={"wandb": {"commit": True}})
        except Exception as err:  # noqa: BLE001
            warnings.warn(f"W&B logging failed ({err}); continuing with local files only.", stacklevel=3)
            self.enabled = False

    def log_final(self, record: dict[str, Any], summary: dict[str, Any]) -> None:
        """``record`` as the last ``metrics.jsonl`` line and ``summary`` as the W&B run summary."""
        if not self.accelerator.is_main_process:
            return
        append_line(self.run_dir / rundir.METRICS, record)
        if self.enabled:
            try:
                self._wandb_run().summary.update(summary)
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B could not take the run summary ({err}); it is in the run folder.", stacklevel=2)

    def finish(self) -> None:
        if self.enabled:
            try:
                self.accelerator.end_training()
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B did not finish cleanly ({err}).", stacklevel=2)
