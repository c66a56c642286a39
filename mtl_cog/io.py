"""Crash-safe file writing: write to a temporary name in the same folder, fsync, rename.

A kill at any moment leaves either the old file or the new one, never a truncated file that a
later step (resume, evaluation, a report) would trust.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # reading the umask means setting it: put it straight back


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` and atomically move the result to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; run folders are meant to be shared
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # make the rename itself durable (power loss, not only a kill)
    finally:
        if tmp.exists():
            tmp.unlink()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON line by rewriting the file atomically (files are small: one line per epoch)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    atomic_write_text(path, old + json.dumps(record) + "\n")
