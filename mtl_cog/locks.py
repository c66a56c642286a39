"""Locks between processes, of the two kinds the project needs: refuse a second writer, or wait for it.

**One writer per run folder** (``acquire``): a lock file created with ``O_EXCL``, naming the
process that holds it. A run (``mtl_cog.training.fit``) holds its folder's lock from the moment it
opens the folder until it returns or fails, so a second ``--resume`` of a run that is still
training, or a second run started with the same ``run_name``, is refused with the holder's PID and
host instead of mixing two writers in one ``metrics.jsonl``. Only the main process of a
multi-process run holds it.

The file holds JSON: ``pid``, ``host``, ``started`` (when the lock was taken) and the process's own
start time. A lock whose process is gone is *stale* (the run was killed: SIGKILL, power loss) and
is taken over with a note. Staleness can only be decided on the host that wrote the lock: a lock
from another host is refused with its host name and the file to delete if that run is over. A PID
that was reused by an unrelated process is recognised by its different start time (``psutil``).
Why not ``fcntl.flock`` here: it cannot say *who* holds the folder, and a run folder's second
writer must be told, not kept waiting. ``O_EXCL`` creation is atomic on local disks and on NFSv3+.

**One builder of shared content** (``waiting_lock``): the data cache is built by one process while
the others that need it *wait* and then read the result. That lock is ``flock`` through
``filelock``: the kernel releases it when its holder dies (a killed builder never blocks the next
one), and NFS carries it between nodes; a file system without working locks is reported.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import filelock
import psutil

from mtl_cog.errors import RunFolderError, UserError
from mtl_cog.io import FILE_MODE, storage_error

# A lock file that is still empty (its writer is between creating and filling it) is young; an
# empty or unreadable one older than this was left by a writer killed in that instant.
UNREADABLE_STALE_AFTER_S = 30.0
_START_TIME_SLACK_S = 1.0  # psutil's create_time is rounded differently on some platforms
WAIT_MESSAGE_EVERY_S = 60.0  # seconds between "still waiting" calls of a waiting lock


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: str  # when the lock was taken (local time, ISO 8601)
    process_started: float  # the holder process's start time (seconds since the epoch)
    token: str  # identifies this lock file: release never deletes another holder's lock

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}, since {self.started}"


def _this_process() -> Holder:
    return Holder(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%S"),
                  psutil.Process().create_time(), uuid.uuid4().hex)


def read_holder(path: Path) -> Holder | None:
    """The lock's holder, or None if the file is missing, empty or not a lock we wrote."""
    try:
        raw = json.loads(path.read_text())
        return Holder(int(raw["pid"]), str(raw["host"]), str(raw["started"]), float(raw["process_started"]),
                      str(raw["token"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_alive(holder: Holder) -> bool:
    """Whether the process named by ``holder`` still runs (always True for another host: we cannot tell)."""
    if holder.host != socket.gethostname():
        return True
    try:
        process = psutil.Process(holder.pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return False
        return abs(process.create_time() - holder.process_started) <= _START_TIME_SLACK_S  # else: PID reused
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process with that PID: assume it is the holder
        return True


def live_holder(path: Path) -> Holder | None:
    """The holder of the lock at ``path`` if that process still runs, else None (no lock, or stale)."""
    holder = read_holder(path)
    return holder if holder is not None and is_alive(holder) else None


class RunLock:
    """A held lock; ``release()`` (or leaving the ``with`` block) deletes the file if it is still ours."""

    def __init__(self, path: Path, holder: Holder) -> None:
        self.path, self.holder = path, holder

    def release(self) -> None:
        current = read_holder(self.path)
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(path: Path, folder_description: str) -> RunLock:
    """Create the lock file at ``path`` for this process, taking over a stale one; refuse a live one."""
    me = _this_process()
    for _ in range(3):  # a stale lock removed by us may be re-taken by a racing process: look again
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
        except FileExistsError:
            _remove_if_stale(path, folder_description)
            continue
        except OSError as err:
            raise storage_error(path, err, "cannot create the lock file") from None
        try:
            os.write(fd, (json.dumps(asdict(me)) + "\n").encode())
            os.fsync(fd)
        except OSError as err:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise storage_error(path, err, "cannot write the lock file") from None
        os.close(fd)
        return RunLock(path, me)
    raise RunFolderError(f"{folder_description}: could not take its lock {path}; another process keeps "
                         "taking it. Try again when the other run has started.")


def _remove_if_stale(path: Path, folder_description: str) -> None:
    holder = read_holder(path)
    if holder is None:
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return  # released meanwhile: try again
        if age < UNREADABLE_STALE_AFTER_S:
            raise RunFolderError(f"{folder_description} is being opened by another process right now ({path} "
                                 "is being written). Try again in a minute.")
        print(f"note: {path} is unreadable and {age:.0f} s old (a run killed while taking it); taking it over.",
              file=sys.stderr)
    elif is_alive(holder):
        where = ("" if holder.host == socket.gethostname() else
                 " (another machine: whether it still runs cannot be checked from here)")
        raise RunFolderError(
            f"{folder_description} is in use by another run: {holder.describe()}{where}. Two writers would mix "
            f"their files; wait for it to finish or stop it. If that run is no longer running, delete {path}."
        )
    else:
        print(f"note: taking over the lock of {holder.describe()}, which is no longer running "
              "(the run was killed).", file=sys.stderr)
    # Another process may have taken over the same stale lock a moment ago: delete only what we judged.
    # (A window of microseconds remains between this read and the unlink; two processes would have to
    # find the same dead holder at the same instant.)
    if read_holder(path) == holder:
        path.unlink(missing_ok=True)


@contextmanager
def waiting_lock(path: Path, on_wait: Callable[[], None],
                 unusable: Callable[[BaseException, bool], UserError]) -> Iterator[None]:
    """Hold the ``flock`` lock at ``path``, waiting while another process holds it.

    ``on_wait()`` runs at once and then every ``WAIT_MESSAGE_EVERY_S`` seconds of waiting (to say
    who is waited for); ``unusable(err, locking)`` is the error to raise when the lock file cannot be
    created (``locking`` false) or the file system cannot lock it (true; e.g. Lustre mounted
    without ``-o flock``).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o666))  # fail here, clearly, if not writable
    except OSError as err:
        raise unusable(err, False) from None
    lock = filelock.FileLock(str(path), mode=0o666)
    waited = False
    while True:
        try:
            lock.acquire(timeout=WAIT_MESSAGE_EVERY_S if waited else 0)
            break
        except filelock.Timeout:  # (a TimeoutError, itself an OSError: caught first)
            on_wait()
            waited = True
        except (NotImplementedError, OSError) as err:  # a file system without working locks
            raise unusable(err, True) from None
    try:
        yield
    finally:
        lock.release()
