"""Database stores (a study's SQLite file, a server's URL) as the sweep and the dashboard open them: an SQLite file
checked before SQLite opens it, every statement time-bound, every failure one line naming the store without its
password. The standard library only: the table of runs imports it without PyTorch.
"""

import errno
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from .errors import ConfigError, exception_chain, first_line
from .files import NotAFileError, kind_of, open_regular
from .passwords import hidden, remember, scrubbed

# A sweep's folder holds these: what the dashboard reads to find its study, and the study's SQLite file by default.
STUDY_FILE, STUDY_DB = "study.json", "study.db"
SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")  # the files SQLite keeps beside a database
STATEMENT_LIMIT_S = 60  # how long one SQL statement may run: Optuna's take milliseconds
_PROGRESS_EVERY = 10_000  # SQLite virtual machine instructions between two calls of the progress handler
_opened: list[str] = []  # the stores this process opened (--storage), as shown (for failure_line)


def check_sqlite_file(path: str | Path, named: str, *, writing: bool, no_link: bool = False) -> None:
    """Refuse, in one line starting with ``named``, an SQLite file SQLite could not use or would hang on: not a
    plain file, a link to nothing (or with ``no_link`` any link); for ``writing``, not writable (it or its folder,
    which the caller made)."""
    path = Path(path)
    what = "to keep a study in"
    if path.is_symlink() and (no_link or not path.exists()):  # to nothing: SQLite would make a file where it points
        link = f"a link (to {os.path.realpath(path)})" if path.exists() else f"a link to nothing ({os.readlink(path)})"
        raise ConfigError(
            f"{named} is {link}: a study's file is not written through a link: move the link away, or give "
            "--storage sqlite:///<the file> to use that file"
        )
    # One that is not SQLite's, SQLite refuses unwritten: "file is not a database" (explained below).
    try:
        with open_regular(path):  # a FIFO or device is refused, not waited on
            found = True
    except FileNotFoundError:
        found = False
    except NotAFileError as err:
        raise ConfigError(f"{named} is {err.kind}, not a file: give the path of a file {what}") from None
    except OSError as err:
        raise ConfigError(f"{named} cannot be read ({first_line(err)}): give a file {what}") from None
    if found and writing and not os.access(path, os.W_OK):
        raise ConfigError(f"{named} is read-only: make it writable, or give another --storage")
    for suffix in SQLITE_COMPANIONS:  # SQLite opens these beside the file, following links, and waits on a FIFO
        companion = path.with_name(path.name + suffix)
        what_it_is = "a link" if companion.is_symlink() else companion.exists() and kind_of(companion.stat().st_mode)
        if what_it_is:
            raise ConfigError(
                f"{named}: {companion.name} beside it is {what_it_is}, which SQLite would write through or wait on: "
                "move it away"
            )
    if writing and not os.access(path.parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{named} cannot be written: its folder {path.parent} is read-only (SQLite writes a journal beside it): "
            "make it writable, or give another --storage"
        )


def sqlite_connector(
    path: str | Path, *, read_only: bool, lock_wait_s: float, statement_limit_s: float = STATEMENT_LIMIT_S
) -> Callable[[], sqlite3.Connection]:
    """Connections to the SQLite file ``path`` for SQLAlchemy's ``creator``, each statement time-bound."""
    target = f"file:{quote(os.path.abspath(path))}?mode={'ro' if read_only else 'rwc'}"
    # Once one statement ran out of time, every later one of these connections stops at once: the file is suspect,
    # and a caller's fallback query (Optuna has some) would only wait as long again.
    stopped: list[bool] = []

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(
            target, uri=True, timeout=lock_wait_s, isolation_level=None, check_same_thread=False
        )
        started = [time.monotonic()]

        def statement_started(_sql: str) -> None:
            started[0] = time.monotonic()

        def over_time() -> int:
            if not stopped and time.monotonic() - started[0] > statement_limit_s:
                stopped.append(True)
            return int(bool(stopped))

        connection.set_trace_callback(statement_started)
        connection.set_progress_handler(over_time, _PROGRESS_EVERY)
        return connection

    return connect


def opened(url: str) -> None:
    """Note that this process uses the store ``url``: its password is hidden from now on. Refuse one whose password
    holds an unescaped ``@``: each reader of URLs would find another password in it."""
    remember(url)
    _opened.append(hidden(url))
    _, separator, rest = url.partition("://")
    if separator and not rest.startswith("/") and rest.partition("?")[0].count("@") > 1:
        raise ConfigError(
            f"--storage {hidden(url)}: the URL holds more than one '@': write an '@' in the user name or password "
            "as %40 (and ':' as %3A, '/' as %2F, '%' as %25)"
        )


def failure_line(err: BaseException) -> str | None:
    """One line for a store's failure behind ``err``, naming the store last opened; None for any other error."""
    reason = database_reason(err)
    return f"--storage {_opened[-1]}: {explained(reason)}" if reason is not None and _opened else None


def explained(reason: str) -> str:
    """What a database's error ``reason`` means, and what to do (without any remembered password)."""
    text = scrubbed(" ".join(reason.split()))[:300]
    lowered = text.lower()
    for needles, meaning in _MEANINGS.items():
        if re.search(needles, lowered):
            return f"{meaning} ({text})"
    return f"{text}: check the store, or give another --storage"


# What a database's error says (any of the words, lowered), and what it means.
_MEANINGS = {
    "file is not a database|malformed|not an sqlite": "the file is not a whole SQLite database (corrupt or "
    "truncated): restore it from a copy, or move it away to start a new study",
    "readonly database|read-only|read only": "it is read-only: make the file and its folder writable, or give "
    "another --storage",
    "database or disk is full|no space left|disk quota": "the disk is full: free some space, or give a --storage on "
    "another disk",
    "disk i/o error|file too large": "the disk refused a write (full, or past the file size limit of ulimit -f): free "
    "space or raise the limit",
    "interrupted": "a query ran past its time bound (a schema that loops?): restore the file from a copy",
    "database is locked": "another process holds it locked: wait for it, or give another --storage",
    "unable to open database file": "the file cannot be opened: check its folder exists and is writable",
    "authentication failed|access denied|no password supplied": "the server refused the user name or "
    "password: check them",
    "does not exist": "the server has no such database or user: create it, or give another --storage",
    "connection refused|could not connect|timeout|timed out|name or service not known|no route": "the server cannot "
    "be reached: check the host and port, and that it runs",
    "invalid integer value|invalid port|port out of range|invalid connection option|invalid dsn": "the URL's host, "
    "port or options are wrong: check them",
}


def database_reason(err: BaseException) -> str | None:
    """The message of the database error (SQLAlchemy's, the driver's, Optuna's storage's) behind ``err``, if any."""
    for current in exception_chain(err):
        module = type(current).__module__ or ""
        if isinstance(current, sqlite3.Error) or module.startswith(("sqlalchemy", "psycopg", "pymysql", "MySQLdb")):
            return first_line(getattr(current, "orig", None) or current)
        if type(current).__name__ == "StorageInternalError" and current.__cause__ is None:
            return str(current)
    return None


DISK_ERRORS = {
    errno.ENOSPC: "the disk is full: free some space",
    errno.EDQUOT: "the disk quota is used up: free some space",
    errno.EFBIG: "the file would pass the file size limit (ulimit -f): raise the limit or free space",
    errno.EROFS: "the file system is read-only: write somewhere else",
    errno.EIO: "the disk reported an error: check it",
}
