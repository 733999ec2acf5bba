"""Where a study lives: an SQLite file beside its trials by default, any SQLAlchemy URL for many machines.

Optuna's RDB storage in both cases (not its journal file, which a killed process can leave locked): each change is
one transaction, and Optuna's heartbeat fails a trial whose worker went silent. SQLite takes its write lock when a
transaction begins (``BEGIN IMMEDIATE``), so two processes that both read a trial as running cannot both change it.
"""

import json
import sqlite3
import time
from pathlib import Path

import optuna
import sqlalchemy
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage
from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError, OperationalError, SQLAlchemyError

from .. import stores
from ..errors import ConfigError, first_line
from ..files import written_whole
from ..passwords import hidden, scrubbed
from ..stores import STUDY_FILE

HEARTBEAT_INTERVAL_S = 10  # a worker records that its trial is alive this often
GRACE_PERIOD_S = 60  # one silent this long has died
SQLITE_LOCK_WAIT_S = 60
CONNECT_TIMEOUT_S = 10


def open_storage(url: str, on_stale, *, beside_trials: bool = False) -> RDBStorage:
    """The storage at ``url``; ``on_stale(study, trial)`` is called for each trial its heartbeat finds dead.

    Any failure stops with one line naming ``--storage`` (or, ``beside_trials``, the default ``study.db``), its
    password hidden.
    """
    stores.opened(url)
    try:
        parsed = make_url(url)
        sqlite = parsed.get_backend_name() == "sqlite"
    except Exception:  # ArgumentError, a port that is no number: ValueError, ...
        raise ConfigError(
            f"--storage {hidden(url)!r} is not a database URL: "
            "give e.g. postgresql+psycopg://user@host/db or sqlite:///file.db"
        ) from None
    if sqlite:
        database = parsed.database
        if database in (None, "", ":memory:"):
            raise ConfigError(f"--storage {hidden(url)}: an SQLite study needs a file: give sqlite:///<file>.db")
        named = f"{database} (the study's file beside its trials)" if beside_trials else f"--storage {hidden(url)}"
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(
                f"{named}: its folder cannot be made ({err.strerror or err}): give a --storage in a writable folder"
            ) from None
        stores.check_sqlite_file(database, named, writing=True, no_link=beside_trials)
        # isolation_level None: the driver begins no transaction of its own; the "begin" listener below does.
        connect = stores.sqlite_connector(database, read_only=False, lock_wait_s=SQLITE_LOCK_WAIT_S)
        engine_kwargs: dict = {"creator": connect}
    else:
        named = f"--storage {hidden(url)}"
        engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    for attempt in range(3):
        try:
            storage = RDBStorage(  # the heartbeat is experimental (since 2.9): command.main ignores that warning
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=on_stale,
            )
            break
        except (ImportError, NoSuchModuleError) as err:
            raise ConfigError(
                f"--storage {hidden(url)}: the database driver for {parsed.drivername} is not installed "
                f"({scrubbed(_reason(err))}); for PostgreSQL: pip install -e '.[postgres]' and postgresql+psycopg://..."
            ) from None
        except (SQLAlchemyError, StorageInternalError, sqlite3.Error, ValueError, TypeError) as err:
            # Two workers creating the tables of a new store at once: one finds them half made, and tries again. (For
            # a server, an OperationalError is one that cannot be reached; a URL option the driver refuses, a
            # ValueError or TypeError: both said at once.)
            reason = _reason(err)
            lasting = any(words in reason.lower() for words in _LASTING) or isinstance(err, ValueError | TypeError)
            if attempt < 2 and not lasting and (sqlite or not isinstance(err, OperationalError)):
                time.sleep(1)
                continue
            raise ConfigError(f"{named}: {stores.explained(reason)}") from None
    if sqlite:
        sqlalchemy.event.listen(
            storage.engine, "begin", lambda connection: connection.exec_driver_sql("BEGIN IMMEDIATE")
        )
    return storage


# What no second try mends: the store itself is at fault, not a worker creating its tables at the same time.
_LASTING = ("not a database", "malformed", "readonly", "full", "i/o", "interrupted", "unable to open", "password")


def _reason(err: BaseException) -> str:
    return stores.database_reason(err) or first_line(err.__cause__ or err)


def write_study_file(folder: Path, study: optuna.Study, url: str, monitor: str, folds: int | None) -> None:
    """Write ``study.json`` into ``folder``, whole or not at all: what the dashboard and the table of runs read."""
    record = {
        "study_name": study.study_name,
        "storage": hidden(url),
        "monitor": monitor,
        "direction": study.direction.name.lower(),
        "folds": folds,
    }
    folder.mkdir(parents=True, exist_ok=True)
    with written_whole(folder / STUDY_FILE) as temporary:
        temporary.write_text(json.dumps(record, indent=1) + "\n")
