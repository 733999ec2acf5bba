"""A sweep's Optuna study in optuna-dashboard, read-only.

    python -m lightning_kit.views dashboard runs/sweeps/lr    # a sweep's study: trials, values, importances
    python -m lightning_kit.views dashboard --storage postgresql://user@host/db --study lr

What it adds to ``optuna-dashboard STORAGE_URL``: it finds the store from the sweep's folder (its
study.json), opens it read-only (the dashboard's buttons that delete a study or edit a trial's note
cannot change a sweep, and a mistyped SQLite path is not made into an empty database), checks the
study is there, and serves on 127.0.0.1 (``--host``, ``--port``) until Ctrl-C or SIGTERM. A study
that is not there, a store that cannot be reached and a port in use are each one line. A store's
password is never printed; the dashboard runs in this process, so the password is not on the command
line of another either. TensorBoard and MLflow's UI need no such help: ``tensorboard --logdir runs``,
``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db``.
"""

import argparse
import contextlib
import importlib.util
import signal
import socket
import sys
import warnings
from pathlib import Path

from . import stores
from .errors import OneLineParser, UserError, command, invoked_as
from .installation import check_installation
from .passwords import hidden, unescaped_at
from .runs.folders import STUDY_FILE
from .runs.sweeps import failure_reason, open_read_only, read_sweep

PORT = 8080


@command
def main(args: list[str] | None = None, prog: str | None = None) -> None:
    """Serve the view ``args`` name (default: ``sys.argv[1:]``); ``prog`` names the command in messages."""
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
    if options.folder is not None:
        folder = _folder(options.folder, "FOLDER", "a sweep's folder (runs/sweeps/<study>)")
        if not (folder / STUDY_FILE).is_file():
            raise UserError(f"FOLDER {folder} holds no {STUDY_FILE}: give a sweep's folder (runs/sweeps/<study>)")
        with warnings.catch_warnings():  # what Optuna says of the importances it computes for the table
            warnings.simplefilter("ignore")
            sweep = read_sweep(folder, folder.name, folder, options.storage)
        if sweep.study is None:
            raise UserError(f"the sweep in {folder} cannot be shown: {'; '.join(sweep.notes)}")
        if options.study is not None and options.study != sweep.study_name:
            raise UserError(f"--study {options.study}: the sweep in {folder} is study {sweep.study_name}")
        storage, name, where = sweep.storage, sweep.study_name, sweep.url
    else:
        storage, name, where = _study_in_store(options.storage, options.study)
    try:
        study_id = storage.get_study_id_from_name(name)
        trials = len(storage.get_all_trials(study_id, deepcopy=False))
    except Exception as err:  # the store lost since it was read, say
        reason = stores.explained(failure_reason(err))
        raise UserError(f"study {name} cannot be read from {hidden(where)}: {reason}") from None
    _check_port(options.host, options.port)
    import optuna_dashboard

    print(f"Optuna's dashboard of study {name} ({trials} trials) in {hidden(where)}, read-only:", flush=True)
    print(f"  http://{_address(options.host)}:{options.port}/dashboard/studies/{study_id}", flush=True)
    with _stopped_by_sigterm():
        optuna_dashboard.run_server(storage, host=options.host, port=options.port)


def _study_in_store(url: str, name: str | None):
    """The store ``url``, read-only, and the study ``name`` in it (its only one when None)."""
    stores.opened(url)
    if unescaped_at(url):
        raise UserError(f"--storage {hidden(url)} holds more than one '@': write an '@' in its password as %40")
    database = stores.sqlite_database(url)
    if database is not None:
        stores.check_sqlite_file(database, f"--storage {hidden(url)}", writing=False)
        if not Path(database).is_file():
            raise UserError(f"--storage {hidden(url)}: there is no such file: give the study.db of a sweep")
    try:
        storage = open_read_only(url, database)
        names = [study.study_name for study in storage.get_all_studies()]
    except Exception as err:  # SQLAlchemy's, Optuna's or the driver's: the reason in words
        raise UserError(f"--storage {hidden(url)} cannot be read: {stores.explained(failure_reason(err))}") from None
    if name is None and len(names) != 1:
        held = f"it holds {', '.join(sorted(names))}" if names else "it holds no study"
        raise UserError(f"--storage {hidden(url)}: give --study NAME ({held})")
    name = names[0] if name is None else name
    if name not in names:
        held = f"it holds {', '.join(sorted(names))}" if names else "it holds no study"
        raise UserError(f"--study {name} is not in {hidden(url)}: {held}")
    return storage, name, url


def _folder(given: str, flag: str, what: str) -> Path:
    folder = Path(given)
    if not folder.exists():
        raise UserError(f"{flag} {folder} does not exist: give {what}")
    if not folder.is_dir():
        raise UserError(f"{flag} {folder} is not a folder: give {what}")
    return folder


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return port


def _check_port(host: str, port: int) -> None:
    """The server can listen on ``host``:``port``: not in use, an address of this machine."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as err:
        raise UserError(f"--host {host} is no address of this machine ({err}): give 127.0.0.1, say") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == getattr(socket, "EADDRINUSE", 98) or "in use" in str(err):
                raise UserError(f"--port {port} is in use on {host}: give another --port") from None
            raise UserError(f"--host {host} --port {port} cannot be listened on ({err.strerror or err})") from None


def _address(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def _stopped_by_sigterm():
    """SIGTERM stops the dashboard's server as Ctrl-C does (it ends its loop on KeyboardInterrupt), exit 0."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
