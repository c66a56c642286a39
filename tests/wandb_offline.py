"""Read what an offline W&B run wrote to disk: the ``run-<id>.wandb`` file that ``wandb sync`` uploads.

Tests check the file itself, not what our code handed to ``wandb.log``: a row that W&B buffered
and never wrote, or a run that never started, shows here and nowhere else. wandb >= 0.18 reads
these files only in its Go core (no Python reader ships with it), so this is a small reader of
the documented layout: a 7-byte header (``:W&B``, magic 0xBEE1, version 0) and then LevelDB-log
records (32 KiB blocks; chunk = crc32 (4 bytes), length (2), type (1: full, 2: first, 3: middle,
4: last)), each record a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    path: Path
    run: wandb_internal_pb2.RunRecord | None = None
    history: list[dict] = field(default_factory=list)  # one dict per committed row, with "_step"
    summary: dict = field(default_factory=dict)  # the last value written for each summary key
    exited: bool = False  # the run's exit record (a finished run) is in the file

    @property
    def steps(self) -> list[int]:
        return [row["_step"] for row in self.history]

    def history_keys(self) -> set[str]:
        """Logged keys (W&B's own ``_step``, ``_runtime``, ``_timestamp`` left out)."""
        return {k for row in self.history for k in row if not k.startswith("_")}


def records(path: Path):
    data = Path(path).read_bytes()
    if data[:4] != b":W&B" or struct.unpack("<H", data[4:6])[0] != 0xBEE1:
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:HEADER]!r})")
    pos, pending = HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {pos}")


def _items(items) -> dict:
    """Protobuf items -> {key: value}; a media value (a table, an image) comes as nested keys: one dict."""
    out: dict = {}
    for item in items:
        value = json.loads(item.value_json)
        if item.key:
            out[item.key] = value
        else:
            node = out
            for part in item.nested_key[:-1]:
                node = node.setdefault(part, {})
            node[item.nested_key[-1]] = value
    return out


def read_run_file(path: Path) -> OfflineRun:
    out = OfflineRun(Path(path))
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.run = record.run
        elif kind == "history":
            out.history.append(_items(record.history.item))
        elif kind == "summary":
            out.summary.update(_items(record.summary.update))
        elif kind == "exit":
            out.exited = True
    return out


def offline_runs(run_dir: Path, settle_s: float = 20.0) -> list[OfflineRun]:
    """Every offline W&B run in a run folder, oldest first (a resumed run has one per attempt).

    W&B's service process writes the ``.wandb`` file after ``finish()`` returns and may still be flushing
    it: the files are read again (up to ``settle_s``) until they stop changing, so a test never reads a
    half-written run (seen as an empty history about one time in six on a loaded machine).
    """
    import time

    deadline = time.monotonic() + settle_s
    previous = None
    while True:
        paths = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
        sizes = [p.stat().st_size for p in paths]
        if (sizes == previous and paths and all(sizes)) or time.monotonic() > deadline:
            return [read_run_file(p) for p in paths]
        previous = sizes
        time.sleep(1.0)
