"""Where an Optuna study lives: a database URL, checked before anything is written or any worker starts.

The fair protocol's study is a database that workers share (``OUT/tuning/optuna.db`` by default,
any SQLAlchemy URL with ``--study-storage``). Optuna opens it through SQLAlchemy, whose failures
arrive late and as tracebacks: an unknown database kind (``NoSuchModuleError``), a driver that is
not installed (``ImportError``), an SQLite file in a read-only folder (``OperationalError``), a
file that is not a database or was cut short (``DatabaseError``), each after the protocol folder
was created. ``check_storage`` refuses each of them first, in one line naming the URL (its
password hidden) and what to do.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from mtl_cog.errors import StorageError, UserError
from mtl_cog.io import check_writable

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
LOCK_WAIT_S = 60  # a worker may be writing the study: wait for its lock rather than call the file damaged
DRIVERS = {"postgresql": "psycopg (pip install 'psycopg[binary]') or psycopg2 (postgresql+psycopg2://...)",
           "mysql": "mysqlclient or PyMySQL (mysql+pymysql://...)"}


def shown(url: str | URL) -> str:
    """The URL as a message may show it: its password hidden."""
    try:
        return (url if isinstance(url, URL) else make_url(url)).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def check_storage(url: str) -> None:
    """Refuse a study storage that cannot hold the study, before anything is written; returns quietly otherwise.

    Checked: the URL parses; SQLAlchemy knows its database kind and its Python driver is installed;
    for SQLite, a file path (not an in-memory database, which every worker would see empty), in a
    writable folder, and an existing file must be an intact SQLite database.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(f"study storage {url!r} is not a database URL; give one such as sqlite:////abs/path/optuna.db "
                        "or postgresql://user@host/database.") from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise UserError(f"study storage {shown(parsed)}: no database kind {parsed.drivername!r} is known; use "
                        "sqlite:///PATH, postgresql://... or mysql://... (SQLAlchemy URLs).") from None
    try:
        dialect.import_dbapi()
    except ImportError as err:
        backend = parsed.get_backend_name()
        driver = DRIVERS.get(backend, f"the Python driver of {parsed.drivername}")
        raise UserError(f"study storage {shown(parsed)}: its database driver is not installed ({err}); install "
                        f"{driver}, or use sqlite:///PATH.") from None
    if parsed.get_backend_name() == "sqlite":
        check_sqlite_file(parsed.database, shown(parsed))


def check_sqlite_file(database: str | None, url: str) -> None:
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        raise UserError(f"study storage {url}: an in-memory SQLite database lives and dies with one process, and "
                        "every worker would see an empty study; give a file, sqlite:////abs/path/optuna.db.")
    path = Path(database)
    try:
        check_writable(path, f"study storage {url}:")  # SQLite writes the file and its journal beside it
    except StorageError as err:
        raise StorageError(f"{err} (SQLite needs to write the file and a journal next to it)") from None
    if not path.is_file():
        return  # a new study: created by the first worker
    if path.stat().st_size == 0:
        return  # SQLite takes an empty file as an empty database
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    damaged = None if header == SQLITE_HEADER else "it does not start with SQLite's header"
    if damaged is None:
        try:
            connection = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True,
                                         timeout=LOCK_WAIT_S)
            try:
                problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
            finally:
                connection.close()
            if problems != ["ok"]:
                damaged = "; ".join(problems[:3])
        except sqlite3.DatabaseError as err:  # "file is not a database", "database disk image is malformed"
            damaged = str(err)
    if damaged:
        raise UserError(f"study storage {url}: {path} is not an intact SQLite database ({damaged}). Restore it from "
                        "a copy, or move it and the study's trial folders away to start the tuning over.")
