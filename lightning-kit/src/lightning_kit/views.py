"""A sweep's Optuna study in optuna-dashboard, read-only: ``python -m lightning_kit.views dashboard runs/sweeps/lr``.

What it adds to ``optuna-dashboard STORAGE_URL``: the store found from the sweep's folder, opened read-only with every
query time-bound, each failure one line, and the password on no command line (the dashboard runs in this process).
"""

import argparse
import importlib.util
import json
import os
import signal
import socket
import sys
from pathlib import Path

from . import stores
from .errors import OneLineParser, UserError, command, first_line, invoked_as
from .installation import check_installation
from .passwords import hidden
from .runs.folders import read_text
from .stores import STUDY_DB, STUDY_FILE

PORT = 8080
READ_LOCK_WAIT_S = 5  # how long to wait for a worker's write lock
READ_STATEMENT_LIMIT_S = 5  # and for any one query (a schema may loop)


@command
def main(args: list[str] | None = None, prog: str | None = None) -> None:
    """Serve the view ``args`` name (default: ``sys.argv[1:]``)."""
    check_installation()
    parser = OneLineParser(
        prog=prog or invoked_as("python -m lightning_kit.views"),
        description="Open a sweep's Optuna study in optuna-dashboard, read-only, on this machine.",
        epilog="Every run's curves: tensorboard --logdir runs. Runs logged with configs/mlflow.yaml: "
        "mlflow ui --backend-store-uri sqlite:///runs/mlflow.db.",
    )
    views = parser.add_subparsers(dest="view", required=True, metavar="VIEW", parser_class=OneLineParser)
    dashboard = views.add_parser("dashboard", help="a sweep's Optuna study in optuna-dashboard")
    dashboard.add_argument("folder", nargs="?", metavar="FOLDER", help="a sweep's folder (runs/sweeps/<study>)")
    dashboard.add_argument("--storage", metavar="URL", help="the study's store, where it is not study.db in FOLDER")
    dashboard.add_argument("--study", metavar="NAME", help="the study in --storage (default: its only one)")
    dashboard.add_argument("--host", default="127.0.0.1", help="the address to serve on (default: 127.0.0.1)")
    dashboard.add_argument("--port", type=_port, default=PORT, help=f"the port (default: {PORT})")
    options = parser.parse_args(sys.argv[1:] if args is None else list(args))
    try:
        _dashboard(options)
    except UserError as err:
        parser.exit(1, f"error: {err}\n")


def _dashboard(options: argparse.Namespace) -> None:
    if options.folder is None and options.storage is None:
        raise UserError("give a sweep's FOLDER (runs/sweeps/<study>), or --storage URL (and --study NAME)")
    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError("Optuna's dashboard is not installed: pip install 'lightning-kit[dashboard]'")
    url, name, named = options.storage, options.study, ""
    if options.folder is not None:
        folder = Path(options.folder)
        if not folder.is_dir():
            problem = "is not a folder" if folder.exists() else "does not exist"
            raise UserError(f"FOLDER {folder} {problem}: give a sweep's folder (runs/sweeps/<study>)")
        if not (folder / STUDY_FILE).is_file():
            raise UserError(f"FOLDER {folder} holds no {STUDY_FILE}: give a sweep's folder (runs/sweeps/<study>)")
        named = f"the sweep in {folder} cannot be shown"
        try:  # the study's name that the sweep's study.json records (a file read as data, bounded)
            found = json.loads(read_text(folder / STUDY_FILE, folder)).get("study_name")
        except (OSError, ValueError, AttributeError, RecursionError, UserError) as err:
            raise UserError(f"{named}: {STUDY_FILE} unreadable: {first_line(err)}") from None
        if not isinstance(found, str):
            raise UserError(f"{named}: {STUDY_FILE} names no study_name")
        if options.study is not None and options.study != found:
            raise UserError(f"--study {options.study}: the sweep in {folder} is study {found}")
        database = folder / STUDY_DB
        if os.path.isfile(database) and Path(os.path.realpath(database)).is_relative_to(folder.resolve()):
            url = f"sqlite:///{database.resolve()}"
        elif url is None:  # a URL in a folder is data: it never makes this command connect anywhere
            raise UserError(f"{named}: its study is not in {STUDY_DB} there: give --storage URL")
        name = found
    storage, name, database = _open(url, name, named)
    try:
        study_id = storage.get_study_id_from_name(name)
        trials = len(storage.get_all_trials(study_id, deepcopy=False))
    except Exception as err:  # a store's failures are many (SQLAlchemy's, Optuna's, the driver's)
        raise UserError(f"study {name} cannot be read from {hidden(url)}: {_unreadable(err, database)}") from None
    _check_port(options.host, options.port)
    import optuna_dashboard

    print(f"Optuna's dashboard of study {name} ({trials} trials) in {hidden(url)}, read-only:", flush=True)
    address = f"[{options.host}]" if ":" in options.host else options.host
    print(f"  http://{address}:{options.port}/dashboard/studies/{study_id}", flush=True)
    # SIGTERM stops the server as Ctrl-C does: bottle.run, under optuna_dashboard.run_server, ends on the
    # KeyboardInterrupt that Python's default SIGINT handler raises, and returns (exit 0).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    optuna_dashboard.run_server(storage, host=options.host, port=options.port)


def _open(url: str, name: str | None, named: str):
    """The store ``url`` opened read-only, the study ``name`` in it (None: its only one), and its SQLite file."""
    import optuna
    from sqlalchemy.engine import make_url

    stores.opened(url)
    named = named or f"--storage {hidden(url)}"
    try:
        parsed = make_url(url)
    except Exception as err:  # ArgumentError, a port that is no number: ValueError, ...
        raise UserError(f"{named}: {_unreadable(err, None)}") from None
    database = parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database != ":memory:" else None
    if database:
        stores.check_sqlite_file(database, named, writing=False)
        if not Path(database).is_file():  # SQLite would make an empty file there
            raise UserError(f"{named}: there is no such file: give the study.db of a sweep")
        connect = stores.sqlite_connector(
            database, read_only=True, lock_wait_s=READ_LOCK_WAIT_S, statement_limit_s=READ_STATEMENT_LIMIT_S
        )
        engine_kwargs: dict = {"creator": connect}
    elif parsed.get_backend_name() == "postgresql":
        limit = f"-c statement_timeout={READ_STATEMENT_LIMIT_S * 1000} -c default_transaction_read_only=on"
        engine_kwargs = {"connect_args": {"connect_timeout": READ_LOCK_WAIT_S, "options": limit}}
    else:
        engine_kwargs = {}
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a store it cannot read is our one line, not its warnings
    try:
        # No tables made in a file that has none; no Alembic schema check (a second to import): a store Optuna
        # cannot read fails at its first query.
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, skip_compatibility_check=True, skip_table_creation=True
        )
        names = [study.study_name for study in storage.get_all_studies()]
    except Exception as err:  # SQLAlchemy's, Optuna's or the driver's: the reason in words
        raise UserError(f"{named}: {_unreadable(err, database)}") from None
    held = f"it holds {', '.join(sorted(names))}" if names else "it holds no study"
    if name is None and len(names) != 1:
        raise UserError(f"{named}: give --study NAME ({held})")
    name = names[0] if name is None else name
    if name not in names:
        asked = f"{named}: study {name}" if named.startswith("the sweep") else f"--study {name}"
        raise UserError(f"{asked} is not in {hidden(url)}: {held}")
    return storage, name, database


def _unreadable(err: BaseException, database: str | None) -> str:
    reason = stores.database_reason(err) or first_line(err)
    journal = Path(f"{database}-journal") if database is not None else None
    if "readonly" not in reason.lower():
        return stores.explained(reason)
    if journal is not None and journal.is_file() and journal.stat().st_size:
        return (
            f"a sweep stopped in the middle of a write, and its {journal.name} is there to undo it: run the "
            f"sweep again (it recovers the file), then look; this only reads ({reason})"
        )
    # Optuna writes to a study that lacks what it writes: this view never does.
    return f"it lacks what Optuna writes into every study (and studies are opened read-only here: {reason})"


def _port(text: str) -> int:
    if not (text.isdecimal() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return int(text)


def _check_port(host: str, port: int) -> None:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as err:
        raise UserError(f"--host {host} is no address of this machine ({err}): give 127.0.0.1, say") from None
    try:
        socket.create_server((host, port), family=family).close()  # SO_REUSEADDR, as the server binds
    except OSError as err:
        if err.errno == getattr(socket, "EADDRINUSE", 98) or "in use" in str(err):
            raise UserError(f"--port {port} is in use on {host}: give another --port") from None
        raise UserError(f"--host {host} --port {port} cannot be listened on ({err.strerror or err})") from None


if __name__ == "__main__":
    main()
