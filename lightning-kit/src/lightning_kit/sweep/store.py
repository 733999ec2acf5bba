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
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning, StorageInternalError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, ProgrammingError

from ..checkpoints import written_whole
from ..errors import ConfigError

STUDY_DB = "study.db"
# What the table of runs reads to find a sweep's study: its name, store, monitored metric and direction.
STUDY_FILE = "study.json"
# A worker records that its trial is alive this often; one silent for the grace period has died.
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
SQLITE_LOCK_WAIT_S = 60
CONNECT_TIMEOUT_S = 10


def default_url(folder: Path) -> str:
    """The SQLite file ``study.db`` in ``folder``, by its absolute path (the URL is the same from any folder)."""
    return f"sqlite:///{(folder / STUDY_DB).resolve()}"


def shown(url: str) -> str:
    """``url`` without its password, for messages and ``study.json``."""
    try:
        return make_url(url).set(password=None).render_as_string(hide_password=False)
    except ArgumentError:
        return "(not a database URL)"


def open_storage(url: str, on_stale) -> RDBStorage:
    """The storage at ``url``; ``on_stale(study, trial)`` is called for each trial its heartbeat finds dead.

    A URL that is not one, a database driver that is not installed, or a server that cannot
    be reached in ``CONNECT_TIMEOUT_S`` stops with one line naming ``--storage``.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"--storage {url!r} is not a database URL: give e.g. postgresql+psycopg://user@host/db or sqlite:///file.db"
        ) from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite:
        # isolation_level None: the driver begins no transaction of its own; ``_begin_immediately`` does.
        connect_args = {"timeout": SQLITE_LOCK_WAIT_S, "isolation_level": None}
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    else:
        connect_args = {"connect_timeout": CONNECT_TIMEOUT_S}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # the heartbeat: experimental since 2.9
                storage = RDBStorage(
                    url,
                    engine_kwargs={"connect_args": connect_args},
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=GRACE_PERIOD_S,
                    heartbeat_stale_trial_callback=on_stale,
                )
            break
        except (ImportError, NoSuchModuleError) as err:
            driver = parsed.drivername
            raise ConfigError(
                f"--storage {shown(url)}: the database driver for {driver} is not installed "
                f"({_reason(err)}); for PostgreSQL: pip install -e '.[postgres]' and postgresql+psycopg://..."
            ) from None
        except (IntegrityError, ProgrammingError, OperationalError, StorageInternalError) as err:
            # Two workers creating the tables of a new store at once: one finds them half made, and tries again.
            # (For a server, an OperationalError is one that cannot be reached: said at once.)
            if attempt < 2 and (sqlite or not isinstance(err, OperationalError)):
                time.sleep(1)
                continue
            raise ConfigError(f"--storage {shown(url)} cannot be reached: {_reason(err)}") from None
    if sqlite:
        sqlalchemy.event.listen(storage.engine, "begin", _begin_immediately)
    return storage


def _begin_immediately(connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _reason(err: BaseException) -> str:
    """The first line of what ``err`` (or the error behind it) says."""
    cause = err.__cause__ or err.__context__ or err
    origin = getattr(cause, "orig", None) or cause
    text = str(origin).strip().splitlines()
    return text[0] if text else type(origin).__name__


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of ``trial`` (Optuna's private ``_trial_id``: see the module's docstring)."""
    return trial._trial_id


def put_back(storage: RDBStorage, trial: Trial) -> None:
    """Return ``trial``, asked but not started, to the queue: the next worker that asks for a trial gets it."""
    storage.set_trial_state_values(trial_id(trial), optuna.trial.TrialState.WAITING)


def write_study_file(folder: Path, study: optuna.Study, url: str, monitor: str) -> None:
    """Write ``study.json`` into ``folder``, whole or not at all: the study's name, store, metric and direction."""
    record = {
        "study_name": study.study_name,
        "storage": shown(url),
        "monitor": monitor,
        "direction": study.direction.name.lower(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    with written_whole(folder / STUDY_FILE) as temporary:
        temporary.write_text(json.dumps(record, indent=1) + "\n")
