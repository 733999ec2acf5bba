"""Runs and sweeps in the browser, in the viewers teams already use: TensorBoard, Optuna's dashboard, MLflow's UI.

    python -m lightning_kit.views tensorboard [FOLDER]        # every run's curves below FOLDER (default runs/)
    python -m lightning_kit.views dashboard runs/sweeps/lr    # a sweep's study: trials, values, importances
    python -m lightning_kit.views dashboard --storage postgresql://user@host/db --study lr
    python -m lightning_kit.views mlflow [FOLDER]             # runs logged with MLflow into FOLDER/mlflow.db

Each reads what the project already wrote (the event files of the default logger, a sweep's Optuna
study, MLflow's SQLite store), checks it first, then serves it on 127.0.0.1 (``--host``, ``--port``)
until Ctrl-C or SIGTERM. A folder without logs, a study that is not there, a store that cannot be
reached and a port in use are each one line. A store's password is never printed; Optuna's dashboard
runs in this process, so the password is not on the command line of another either.
"""

import argparse
import contextlib
import importlib.util
import os
import shutil
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

PORTS = {"tensorboard": 6006, "dashboard": 8080, "mlflow": 5000}
EVENT_FILES = "events.out.tfevents."
MLFLOW_STORE = "mlflow.db"
# How many folder entries the search for event files looks at before it says there are none.
MAX_ENTRIES_SEARCHED = 200_000


@command
def main(args: list[str] | None = None, prog: str | None = None) -> None:
    """Serve the view ``args`` name (default: ``sys.argv[1:]``); ``prog`` names the command in messages."""
    check_installation()
    parser = OneLineParser(
        prog=prog or invoked_as("python -m lightning_kit.views"),
        description="Open runs and sweeps in TensorBoard, Optuna's dashboard or MLflow's UI, on this machine.",
    )
    views = parser.add_subparsers(dest="view", required=True, metavar="VIEW", parser_class=OneLineParser)
    board = views.add_parser("tensorboard", help="every run's curves, from the event files beside metrics.csv")
    board.add_argument("folder", nargs="?", default="runs", metavar="FOLDER", help="the runs (default: runs)")
    dashboard = views.add_parser("dashboard", help="a sweep's Optuna study in optuna-dashboard")
    dashboard.add_argument("folder", nargs="?", metavar="FOLDER", help="a sweep's folder (runs/sweeps/<study>)")
    dashboard.add_argument("--storage", metavar="URL", help="the study's store, where it is not study.db in FOLDER")
    dashboard.add_argument("--study", metavar="NAME", help="the study in --storage (default: its only one)")
    mlflow = views.add_parser("mlflow", help="runs logged with MLflow (configs/mlflow.yaml) in MLflow's UI")
    mlflow.add_argument("folder", nargs="?", default="runs", metavar="FOLDER", help=f"holds {MLFLOW_STORE}")
    for name, view in (("tensorboard", board), ("dashboard", dashboard), ("mlflow", mlflow)):
        view.add_argument("--host", default="127.0.0.1", help="the address to serve on (default: 127.0.0.1)")
        view.add_argument("--port", type=_port, default=PORTS[name], help=f"the port (default: {PORTS[name]})")
    options = parser.parse_args(sys.argv[1:] if args is None else list(args))
    try:
        {"tensorboard": _tensorboard, "dashboard": _dashboard, "mlflow": _mlflow}[options.view](options)
    except UserError as err:
        parser.exit(1, f"error: {err}\n")


def _tensorboard(options: argparse.Namespace) -> None:
    folder = _folder(options.folder, "FOLDER", "the folder of your runs (by default runs/)")
    if not _has_event_files(folder):
        raise UserError(
            f"FOLDER {folder} holds no TensorBoard logs ({EVENT_FILES}* files): train a run first; a run with "
            "--trainer.logger.init_args.tensorboard false, or a logger without TensorBoard, writes none"
        )
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError("TensorBoard is not installed: pip install tensorboard")
    _check_port(options.host, options.port)
    _serve([sys.executable, "-m", "tensorboard.main", "--logdir", str(folder), "--host", options.host,
            "--port", str(options.port)])  # fmt: skip


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


def _mlflow(options: argparse.Namespace) -> None:
    folder = _folder(options.folder, "FOLDER", f"the folder holding {MLFLOW_STORE} (by default runs/)")
    store = folder / MLFLOW_STORE
    if not store.exists():
        raise UserError(
            f"{store} does not exist: log a run to MLflow first (train.py --config configs/mlflow.yaml; "
            "MLFlowLogger with tracking_uri sqlite:///runs/mlflow.db)"
        )
    stores.check_sqlite_file(store, str(store), writing=False)
    program = shutil.which("mlflow")
    if program is None:
        raise UserError("MLflow's UI is not installed (no mlflow command): pip install 'lightning-kit[mlflow]'")
    if Path(program).parent == Path(sys.executable).parent and importlib.util.find_spec("flask") is None:
        # This environment's mlflow command, of MLflow's client alone (mlflow-skinny): its UI would stop on an
        # ImportError's traceback.
        raise UserError("MLflow's client is installed here, but not its UI (mlflow-skinny): pip install mlflow")
    _check_port(options.host, options.port)
    _serve([program, "ui", "--backend-store-uri", f"sqlite:///{store.resolve()}", "--host", options.host,
            "--port", str(options.port)])  # fmt: skip


def _folder(given: str, flag: str, what: str) -> Path:
    folder = Path(given)
    if not folder.exists():
        raise UserError(f"{flag} {folder} does not exist: give {what}")
    if not folder.is_dir():
        raise UserError(f"{flag} {folder} is not a folder: give {what}")
    return folder


def _has_event_files(folder: Path) -> bool:
    """Whether a TensorBoard event file lies below ``folder`` (links not followed, the search bounded)."""
    seen = 0
    for _, folders, files in os.walk(folder):
        if any(name.startswith(EVENT_FILES) for name in files):
            return True
        seen += len(folders) + len(files)
        if seen > MAX_ENTRIES_SEARCHED:
            return False
    return False


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


def _serve(command: list[str]) -> None:
    """Become the viewer's own program (its output, its Ctrl-C and SIGTERM): nothing of this process is left."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(command[0], command)
    except OSError as err:
        raise UserError(f"{command[0]} cannot be run ({err.strerror or err})") from None


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
