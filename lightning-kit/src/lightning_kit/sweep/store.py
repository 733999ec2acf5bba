"""Where a study lives: an SQLite file beside its trials by default, any SQLAlchemy URL for many machines.

Optuna's RDB storage, in both cases. Each change to the study is one database transaction,
so a process killed at any moment leaves the study whole and unlocked (Optuna's journal file
can leave a stale lock behind), and the storage has Optuna's heartbeat: every worker records
that its trial is alive, and a trial whose worker went silent is failed by the next worker
that looks.

SQLite takes its write lock when a transaction begins (``BEGIN IMMEDIATE``): two processes
that both read a trial as running cannot both change it, and a busy database is waited for,
up to ``SQLITE_LOCK_WAIT_S``, instead of failing at once.

One private Optuna API is used, here only: ``Trial._trial_id`` (the storage's id of a trial,
which the heartbeat and putting a trial back in the queue need); tested on Optuna 5.0.0.
"""

import json
import sqlite3
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning, StorageInternalError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial
from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError, OperationalError, SQLAlchemyError

from .. import stores
from ..errors import ConfigError, first_line
from ..files import written_whole
from ..passwords import hidden, scrubbed, unescaped_at
from ..stores import STUDY_DB, STUDY_FILE

# A worker records that its trial is alive this often; one silent for the grace period has died.
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
SQLITE_LOCK_WAIT_S = 60
CONNECT_TIMEOUT_S = 10


def default_url(folder: Path) -> str:
    """The SQLite file ``study.db`` in ``folder``, by its absolute path (the URL is the same from any folder).

    The folder is resolved (``runs/`` may be a link to a larger disk), the file's own name is not:
    a ``study.db`` that is a link is refused by ``open_storage``, never written through.
    """
    return f"sqlite:///{folder.resolve() / STUDY_DB}"


def open_storage(url: str, on_stale, *, beside_trials: bool = False) -> RDBStorage:
    """The storage at ``url``; ``on_stale(study, trial)`` is called for each trial its heartbeat finds dead.

    A URL that is not one, a database driver that is not installed, a server that cannot
    be reached in ``CONNECT_TIMEOUT_S``, or an SQLite file that cannot hold a study stops
    with one line naming ``--storage`` (or, ``beside_trials``, the default ``study.db``), its
    password hidden. Every statement on an SQLite file is time-bound (``stores.sqlite_connector``).
    """
    stores.opened(url)
    if unescaped_at(url):
        raise ConfigError(
            f"--storage {hidden(url)}: the URL holds more than one '@': write an '@' in the user name or password "
            "as %40 (and ':' as %3A, '/' as %2F, '%' as %25)"
        )
    try:
        parsed = make_url(url)
        sqlite = parsed.get_backend_name() == "sqlite"
    except Exception:  # ArgumentError, a port that is no number: ValueError, ...
        raise ConfigError(
            f"--storage {hidden(url)!r} is not a database URL: "
            "give e.g. postgresql+psycopg://user@host/db or sqlite:///file.db"
        ) from None
    if sqlite:
        database = stores.sqlite_database(url)
        if database is None:
            raise ConfigError(f"--storage {hidden(url)}: an SQLite study needs a file: give sqlite:///<file>.db")
        named = f"{database} (the study's file beside its trials)" if beside_trials else f"--storage {hidden(url)}"
        stores.check_sqlite_file(database, named, writing=True, no_link=beside_trials)
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(
                f"{named}: its folder cannot be made ({err.strerror or err}): give a --storage in a writable folder"
            ) from None
        # isolation_level None: the driver begins no transaction of its own; ``_begin_immediately`` does.
        connect = stores.sqlite_connector(database, read_only=False, lock_wait_s=SQLITE_LOCK_WAIT_S)
        engine_kwargs: dict = {"creator": connect}
    else:
        named = f"--storage {hidden(url)}"
        engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # the heartbeat: experimental since 2.9
                storage = RDBStorage(
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
        sqlalchemy.event.listen(storage.engine, "begin", _begin_immediately)
    return storage


# What no second try mends: the store itself is at fault, not a worker creating its tables at the same time.
_LASTING = ("not a database", "malformed", "readonly", "full", "i/o", "interrupted", "unable to open", "password")


def _begin_immediately(connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _reason(err: BaseException) -> str:
    return stores.database_reason(err) or first_line(err.__cause__ or err)


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of ``trial`` (Optuna's private ``_trial_id``: see the module's docstring)."""
    return trial._trial_id


def put_back(storage: RDBStorage, trial: Trial) -> None:
    """Return ``trial``, asked but not started, to the queue: the next worker that asks for a trial gets it."""
    storage.set_trial_state_values(trial_id(trial), optuna.trial.TrialState.WAITING)


def write_study_file(folder: Path, study: optuna.Study, url: str, monitor: str, folds: int | None) -> None:
    """Write ``study.json`` into ``folder``, whole or not at all: the study's name, store, metric and direction, and
    a cross-validation's number of folds (the dashboard finds the study by it, the table of runs sums up the folds)."""
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
