"""Crash-safe file writing: write to a temporary name in the same folder, fsync, rename.

A kill at any moment leaves either the old file or the new one, never a truncated file that a
later step (resume, evaluation, a report) would trust. A write that fails (read-only folder, a
regular file where a folder should be, full disk, ``ulimit -f``) raises a ``StorageError`` that
names the file and the likely fix; its temporary file is removed and the old file is untouched.
A temporary file left by a *killed* writer is removed by ``remove_temp_files`` (run folders do it
when they are opened, under their lock). Whole folders (the data cache) are published the same
way: written into a temporary sibling, fsynced, renamed into place (``publish_folder``).

Line logs (``metrics.jsonl``) are appended instead (``append_jsonl``): O(1) per line, and a kill
in the middle of an append leaves at most one partial last line, which the resume logic
(``mtl_cog.runs.training_state``) cuts off because it keeps only the lines its saved state counts.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtl_cog.errors import StorageError, UserError

try:
    import resource
except ImportError:  # Windows
    resource = None

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # reading the umask means setting it: put it straight back
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file: run folders are meant to be shared
TEMP_SUFFIX = ".tmp"
# mkstemp names: "." + target name + "." + 8 random characters + ".tmp"
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + r"$")

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space",
    errno.EDQUOT: "the disk quota is used up: free some space",
    errno.EFBIG: "the file would exceed the file-size limit (see `ulimit -f`)",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "no permission to write there: choose a writable folder",
    errno.EPERM: "no permission to write there: choose a writable folder",
    errno.ENOTDIR: "a part of the path is a regular file, not a folder: choose another path",
    errno.EEXIST: "a part of the path is a regular file, not a folder: choose another path",
    errno.EISDIR: "that path is a folder: give a file name",
}


def storage_error(path: str | Path, err: OSError, doing: str = "cannot write") -> StorageError:
    """A ``StorageError`` naming ``path``, what the OS said and what to do about it."""
    code = err.errno or _likely_cause(Path(path).parent)
    hint = _HINTS.get(code or 0, "check the path and the disk")
    return StorageError(f"{doing} {path}: {err.strerror or err} ({hint}).")


def _likely_cause(folder: Path) -> int | None:
    """For an ``OSError`` without errno (numpy: "N requested and M written"): a full disk or a size limit?"""
    try:
        stats = os.statvfs(folder)
        if stats.f_bavail * stats.f_frsize < 1 << 20:
            return errno.ENOSPC
    except (OSError, AttributeError):  # no statvfs on this platform
        pass
    if resource is not None and resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return errno.EFBIG
    return None


def check_writable(path: str | Path, what: str, folder: bool = False) -> None:
    """Refuse, before any work, a ``path`` that cannot be written: a file (``folder=True``: a folder)
    that is a folder (a file), or whose nearest existing ancestor is a file or not writable.
    ``what`` names the setting in the message (``output_dir``, ``--out``)."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder, not a file"
        raise StorageError(f"{what} {path} is {kind}; choose another path.")
    existing = path if folder and path.exists() else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StorageError(f"{what} {path}: {existing} is a file, not a folder; choose another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StorageError(f"{what} {path}: {existing} is not writable (read-only, or owned by someone else); "
                           "choose a writable folder.")


def make_folder(folder: str | Path) -> Path:
    """``mkdir -p`` whose failure (a file in the way, a read-only parent) is a ``StorageError``."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(folder, err, "cannot create the folder") from None
    return folder


def output_folder(folder: str | Path, what: str) -> Path:
    """Create a command's output folder (``mkdir -p``), or refuse it in one line naming ``what`` (``--out``):
    a file in the way, or a folder (existing or its nearest existing parent) that cannot be written.

    Every command creates its output folder through this helper, and calls ``check_writable(folder,
    what, folder=True)`` before its work, so a bad path is refused before the work, not after it.
    """
    check_writable(folder, what, folder=True)  # an existing read-only folder: mkdir alone would not fail
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(folder, err, f"{what}: cannot create the folder") from None
    return Path(folder)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` and atomically move the result to ``path``."""
    path = Path(path)
    make_folder(path.parent)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as err:
        raise storage_error(path, err) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        # after writing: some writers (safetensors) replace the file and make it 0600
        os.chmod(tmp, FILE_MODE)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # make the rename itself durable (power loss, not only a kill)
    except UserError:
        raise
    except OSError as err:
        raise storage_error(path, err) from None
    except Exception as err:
        # libraries wrap a failed write in their own types (safetensors: SafetensorError with the
        # OS message); only a write that left no complete file is the user's disk problem
        cause = _os_error_in(err)
        if cause is None:
            raise
        raise storage_error(path, cause) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _os_error_in(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err`` (its cause chain, or an OS message in its text), if any."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    text = str(err)
    for code in _HINTS:
        if os.strerror(code) in text:
            return OSError(code, os.strerror(code))
    return None


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every readable line of a JSONL file ([] when there is none); a torn line of a killed writer is
    skipped, so the lines before it still count (for reports; a resume trims instead)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for text in path.read_text().splitlines():
        try:
            records.append(json.loads(text))
        except ValueError:
            continue
    return records


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (fsync): O(1) however long the file is.

    A kill during the write can leave a partial last line; readers that resume a run cut the file
    back to the line count of their saved state (``mtl_cog.runs.training_state``).
    """
    path = Path(path)
    line = (json.dumps(record) + "\n").encode()
    try:
        with open(path, "ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        raise storage_error(path, err) from None


def is_temp_file_name(name: str) -> bool:
    """Whether ``name`` is the name of an ``atomic_write`` temporary file."""
    return bool(_TEMP_NAME.match(name))


def remove_temp_files(folder: str | Path) -> list[Path]:
    """Delete the temporary files that killed ``atomic_write`` calls left in ``folder``; return them.

    Only call it while no other process writes into ``folder`` (a run folder: under its lock).
    """
    removed = []
    for entry in Path(folder).iterdir():
        if is_temp_file_name(entry.name) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


# ------------------------------------------------------------------------ whole folders, atomically
# A folder of several large files (the data cache) is written the same way: into a temporary
# sibling (same file system, so the rename is atomic), every file fsynced, then renamed into place.


def temp_folder_beside(folder: str | Path) -> Path:
    """A new empty folder next to ``folder`` to write its next content into (raises ``OSError``)."""
    folder = Path(folder)
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def fsync_files(folder: Path) -> None:
    """Flush every file of ``folder`` so that a rename publishes complete data even after a power loss."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def publish_folder(tmp: Path, folder: Path) -> None:
    """Make the complete folder ``tmp`` the folder ``folder`` (raises ``OSError``).

    A previous ``folder`` is moved aside first and then deleted; processes still reading it keep
    their open files (POSIX keeps an unlinked file's data until the last reader closes it).
    """
    fsync_files(tmp)
    stale = None
    if folder.exists():
        stale = folder.with_name(f".stale-{folder.name}-{uuid.uuid4().hex[:8]}")
        os.replace(folder, stale)
    os.replace(tmp, folder)
    _fsync_dir(folder.parent)  # make the rename itself durable, as ``atomic_write`` does
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


def remove_folder_leftovers(folder: Path) -> None:
    """Delete the temporary and stale siblings of ``folder`` that killed writers left.

    Only call it while no other process writes ``folder`` (the data cache: under its build lock).
    """
    for prefix in (".tmp-", ".stale-"):
        for path in folder.parent.glob(f"{prefix}{folder.name}-*"):
            shutil.rmtree(path, ignore_errors=True)
