"""What the library's tests share: two projects baked from this repository's template, and the fixtures of a run.

The library is tested against the projects it is made for: at the start of the session the
template is baked once per task (``image_project``, the reference CNN on images;
``sequence_project``, the attention classifier on token sequences) into a temporary folder,
whose ``src/`` folders are put on the import path of this process and of every process it
starts (``PYTHONPATH``). Tests import them like any installed project, and run their
``train.py``. The projects' own suites are the template's tests' business (``tests/`` at the
repository's top); these test the library's machinery through them.
"""

import atexit
import contextlib
import csv
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import torch
from cookiecutter.main import cookiecutter
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image

# Each process of this session runs PyTorch's operations on one thread: xdist's workers, and every process a test
# starts (trainings, sweeps, DDP ranks, servers), which inherit OMP_NUM_THREADS. Their networks are small, and
# several run at once: with a thread per core in each, OpenMP's threads spin waiting for cores the other processes
# hold. Measured on 2 cores: the suite took 1,100 CPU-seconds (594 s) with them, 736 (393 s) with one each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The template, beside this library in the repository.
TEMPLATE = Path(__file__).resolve().parents[2]
TASKS = {"image": "image_project", "sequence": "sequence_project"}
_BAKED = "LIGHTNING_KIT_TEST_PROJECTS"


def _bake_projects() -> Path:
    """Bake each task once for this test session (xdist's workers reuse the controller's folder)."""
    if os.environ.get(_BAKED):
        return Path(os.environ[_BAKED])
    folder = Path(tempfile.mkdtemp(prefix="lightning-kit-projects-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for task, slug in TASKS.items():
        cookiecutter(
            str(TEMPLATE),
            no_input=True,
            output_dir=str(folder),
            extra_context={"project_name": slug, "project_slug": slug, "task": task},
        )
    os.environ[_BAKED] = str(folder)
    return folder


PROJECTS = _bake_projects()
IMAGE_PROJECT = PROJECTS / TASKS["image"]
SEQUENCE_PROJECT = PROJECTS / TASKS["sequence"]
_paths = [str(IMAGE_PROJECT / "src"), str(SEQUENCE_PROJECT / "src")]
sys.path[:0] = [path for path in _paths if path not in sys.path]
os.environ["PYTHONPATH"] = os.pathsep.join([*_paths, *filter(None, [os.environ.get("PYTHONPATH")])])

from image_project.cli import ProjectCLI, main  # noqa: E402  (importable once baked, above)

from lightning_kit import building as kit_cli  # noqa: E402

# Most tests need one project: the image one, as the default bake is.
PROJECT = IMAGE_PROJECT
CONFIGS = PROJECT / "configs"
# The run that `trained_once` trains, and its last checkpoint, relative to the run's folder.
RUN = Path("runs/lightning_logs/version_0")
LAST = RUN / "checkpoints" / "last.ckpt"

# Every wall-clock limit in these tests (`from conftest import HANG_GUARD_S`) guards against a
# hang and judges no speed: a busy machine makes the tests slower, never wrong. The slowest single
# wait, a short training run in its own process, took about 2 minutes on 2 cores beside two CPU-bound
# processes and other test runs; 20 minutes is an order of magnitude above that. It stays under the
# half hour a DDP process waits for a dead one, so the test that a dying rank ends the others at once
# cannot pass late.
HANG_GUARD_S = 20 * 60


def build(args: list[str]):
    """The image project's model and data module from ``train.py`` arguments (``lightning_kit.building.build``)."""
    return kit_cli.build(ProjectCLI, args)


def build_all(args: list[str], prog: str | None = None):
    """The image project's model, data module and Trainer from ``train.py`` arguments."""
    return kit_cli.build_all(ProjectCLI, args, prog=prog)


@pytest.fixture(autouse=True)
def _lightnings_rank_is_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """No test leaves this process with another rank than it found (``rank_zero_only.rank``): tests share their
    worker's process, and at rank 1 every later run in it would skip what rank 0 does: its logs, its files."""
    before = rank_zero_only.rank
    yield
    assert rank_zero_only.rank == before, f"rank_zero_only.rank left at {rank_zero_only.rank}, was {before}"


@pytest.fixture
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so runs/ and data/ are written there and nowhere else."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def synthetic_config() -> str:
    """The configuration for offline training on synthetic data."""
    return str(CONFIGS / "synthetic.yaml")


@pytest.fixture(scope="session")
def fast_args(synthetic_config: str) -> list[str]:
    """Command-line flags for a short CPU run on offline data: a few batches of each stage."""
    return [
        "--config",
        synthetic_config,
        "--accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        *("--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"),
        *("--trainer.limit_test_batches", "2", "--trainer.limit_predict_batches", "2"),
    ]


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory, fast_args) -> Path:
    """A folder holding the ``runs/`` of one short fit, trained once for every test that only reads it."""
    folder = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main([*fast_args, "--max_epochs", "1"])
    return folder


@pytest.fixture(scope="session")
def trained_sequence_once(tmp_path_factory, fast_args, synthetic_config) -> Path:
    """``trained_once`` of the sequence project: the ``runs/`` of one short fit of its attention classifier."""
    from sequence_project.cli import main as train_sequence

    folder = tmp_path_factory.mktemp("trained-sequence")
    sequence_config = str(SEQUENCE_PROJECT / "configs" / "synthetic.yaml")
    args = [sequence_config if arg == synthetic_config else arg for arg in fast_args]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        train_sequence([*args, "--max_epochs", "1"])
    return folder


@pytest.fixture
def run_copy(trained_once, in_tmp_path, monkeypatch) -> Path:
    """A copy of a short run in the test's folder, which is importable as code would be beside train.py."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "runs")
    monkeypatch.syspath_prepend(str(in_tmp_path))
    return in_tmp_path


def exit_message(run, *args) -> str:
    """What ``run(args)`` exits with; fails when it does not exit."""
    with pytest.raises(SystemExit) as exit_info:
        run(list(args))
    return str(exit_info.value.code)


def refused(args: list[str], capsys: pytest.CaptureFixture, run=main) -> str:
    """The one line with which ``train.py args`` stops (``run``: the main of a project's train.py, by default the
    image project's); fails when it does not stop, or with more than a line."""
    with pytest.raises(SystemExit) as exit_info:
        run(args)
    # The parser itself (a value not of the argument's type) prints its line and exits with 2.
    message = capsys.readouterr().err if exit_info.value.code == 2 else str(exit_info.value.code)
    assert message.startswith("error: ") and "\n" not in message.strip(), message
    assert not Path("runs").exists(), "a refused run must write nothing"
    return message


def _with_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def make_fifo():
    """Make FIFOs (named pipes) that cannot hang a test: code that opens one by mistake reads an empty file.

    Opening a FIFO waits for its other end. A thread opens the other end of each, and closes
    it at once, whenever someone is waiting, so a wrong open returns instead of hanging, and
    the test's assertion (that the FIFO was refused by name) fails.
    """
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    made, done = [], threading.Event()

    def open_other_ends() -> None:
        while not done.wait(0.05):
            for path in made:
                for flags in (os.O_WRONLY, os.O_RDONLY):
                    with contextlib.suppress(OSError):  # ENXIO: nobody reads it, so no one waits
                        os.close(os.open(path, flags | os.O_NONBLOCK))

    thread = threading.Thread(target=open_other_ends, daemon=True)
    thread.start()

    def make(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    done.set()
    thread.join()


@pytest.fixture
def train_process(in_tmp_path: Path):
    """Start ``train.py`` with the given arguments in its own process, in the test's folder.

    For what cannot run inside pytest: signals, and strategies that launch processes.
    The process gets Ctrl-C's default handling even when the tests run as a background
    job, whose children inherit SIGINT ignored: it stands for a run started in a terminal.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = []

    def start(*args: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(PROJECT / "train.py"), *args],
            cwd=in_tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_with_ctrl_c,
        )
        started.append(process)
        return process

    yield start
    for process in started:  # a failed test leaves no run behind (the others of a DDP run follow it)
        if process.poll() is None:
            process.kill()
            process.communicate()


# Where the command line writes its runs, relative to the folder it runs in.
RUNS = Path("runs/lightning_logs")


def checkpoint(run: int, name: str = "last.ckpt") -> Path:
    return RUNS / f"version_{run}" / "checkpoints" / name


def wait_until_written(path: Path, process: subprocess.Popen) -> None:
    """Return once ``path`` exists, however slow the machine; fail if the run ends first or hangs."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert process.poll() is None, f"the run ended before writing {path}:\n{process.communicate()[0]}"
        assert time.monotonic() < deadline, f"no {path} after {HANG_GUARD_S} s: the run hangs"
        time.sleep(0.05)


def epoch_metrics(run: int, evaluation: str | None = None) -> dict[int, dict[str, str]]:
    """{epoch: {column: value}} of a run's metrics.csv (or of an evaluation of it), merging the rows of each epoch."""
    merged: dict[int, dict[str, str]] = {}
    folder = RUNS / f"version_{run}" / (f"{evaluation}/version_0" if evaluation else "")
    with (folder / "metrics.csv").open() as file:
        for row in csv.DictReader(file):
            merged.setdefault(int(row["epoch"]), {}).update({key: value for key, value in row.items() if value})
    return merged


class SignalAt(L.Callback):
    """Send this process a signal after a given training or validation batch: a scheduler's SIGTERM, or Ctrl-C."""

    def __init__(self, epoch: int = 0, train_batch: int = -1, val_batch: int = -1, signum: int = 15) -> None:
        self.epoch, self.train_batch, self.val_batch, self.signum = epoch, train_batch, val_batch, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.train_batch):
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and (trainer.current_epoch, batch_idx) == (self.epoch, self.val_batch):
            os.kill(os.getpid(), self.signum)


@pytest.fixture
def trained_run(trained_once, in_tmp_path) -> Path:
    """The last checkpoint of a short fit, in a copy of its run folder in the test's own folder."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "runs")
    return checkpoint(0)


# A PostgreSQL server for the tests of the database path (Optuna's RDB storage). Its waits are
# hang guards, like HANG_GUARD_S: the server starts and stops in about a second.
POSTGRES_WAIT_S = 120


def _postgres_binaries() -> Path | None:
    """The folder of PostgreSQL's initdb and postgres: on PATH, else the newest in /usr/lib/postgresql (Debian)."""

    def version(folder: Path) -> list[int]:
        return [int(part) for part in folder.parent.name.split(".") if part.isdigit()]

    on_path = shutil.which("initdb")
    folders = [Path(on_path).parent] if on_path else []
    folders += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    return next((folder for folder in folders if (folder / "initdb").exists() and (folder / "postgres").exists()), None)


def _unprivileged_account() -> dict:
    """Popen's arguments that run PostgreSQL as the postgres (else nobody) user when we are root, which it refuses."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return {}
    import pwd  # POSIX only, and only needed as root

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            account = pwd.getpwnam(name)
            return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    pytest.skip("PostgreSQL refuses to run as root, and there is no postgres or nobody user to run it as")


def _ends_with_this_process() -> None:
    """Have Linux stop the server (PostgreSQL's immediate shutdown) should this process die without stopping it."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGQUIT)  # 1: PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# How long a model server a test starts may take to answer /health: a bound on a hang, not on speed.
SERVER_START_S = 300


def wait_until_healthy(url: str, server: subprocess.Popen, log) -> None:
    """Return once ``url``/health answers ok; fail with the last lines of the server's ``log`` (a binary file) if it
    ends first or takes longer than ``SERVER_START_S``."""
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            if answer.read() == b"ok":
                return
        time.sleep(0.1)
    log.seek(0)
    said = log.read().decode(errors="replace").strip().splitlines()[-5:]
    pytest.fail(f"the server did not start: {' / '.join(said) or 'it said nothing'}")


@contextlib.contextmanager
def postgres_server(database: str, password: str | None = None) -> Iterator[int]:
    """A PostgreSQL server of this test process on a free port of 127.0.0.1, with an empty ``database``; its port.

    Without ``password`` it trusts every connection; with one, the ``postgres`` user logs in with it alone.
    Stopped and removed at the end. Skipped, with the reason, where PostgreSQL's binaries or psycopg are missing.
    """
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[postgres]'")
    binaries = _postgres_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed: no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin")
    account = _unprivileged_account()
    # Not in tmp_path: its parent folders are closed to the user the server runs as.
    folder = Path(tempfile.mkdtemp(prefix="postgres-"))
    server = None
    try:
        # UTF8: from the C locale's default, SQL_ASCII, psycopg returns bytes, not text. -N: no fsync.
        settings = ["-U", "postgres", "--locale=C", "-E", "UTF8", "-N"]
        if password is None:
            settings.append("--auth=trust")
        else:
            (folder / "password").write_text(password + "\n")
            settings += ["--auth=scram-sha-256", f"--pwfile={folder / 'password'}"]
        if account:
            for path in folder.iterdir():
                os.chown(path, account["user"], account["group"])
            os.chown(folder, account["user"], account["group"])
        initdb = subprocess.run(
            [binaries / "initdb", "-D", folder / "data", *settings],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=POSTGRES_WAIT_S,
            **account,
        )
        assert initdb.returncode == 0, f"initdb failed:\n{initdb.stdout}"
        (folder / "password").unlink(missing_ok=True)
        port = _free_port()
        log = folder / "server.log"
        with log.open("wb") as output:  # -F: no fsync, a test's database need not survive a power cut
            server = subprocess.Popen(
                [binaries / "postgres", "-D", folder / "data", "-h", "127.0.0.1", "-p", str(port), "-k", folder, "-F"],
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=_ends_with_this_process,
                **account,
            )
        deadline = time.monotonic() + POSTGRES_WAIT_S
        address = {"host": "127.0.0.1", "port": port, "user": "postgres", "password": password, "connect_timeout": 10}
        while True:
            try:
                with psycopg.connect(**address, autocommit=True) as connection:
                    connection.execute(f"CREATE DATABASE {database}")
                break
            except psycopg.OperationalError:
                assert server.poll() is None, f"PostgreSQL stopped while starting:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"PostgreSQL did not start in time:\n{log.read_text()}"
                time.sleep(0.05)
        yield port
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown: it ends the open sessions, then itself
            try:
                server.wait(timeout=POSTGRES_WAIT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The SQLAlchemy URL of an empty database on a PostgreSQL server of this test process, removed at the end."""
    with postgres_server("tests") as port:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/tests"


# Image files for the tests of listing and decoding.
def png_header(width: int, height: int) -> bytes:
    """A PNG file that says it holds ``width`` x ``height`` pixels, with next to no data: a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


ORANGE = (200, 100, 50)


def solid(path: Path, colour=ORANGE, size: tuple[int, int] = (20, 12), mode: str = "RGB", **save) -> Path:
    """An image of one colour, in ``mode``, written in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour)
    image = image.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else image.convert(mode)
    image.save(path, **save)
    return path


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """Two classes, images at two depths and in mixed case, and what must be ignored: hidden and non-image files."""
    root = tmp_path / "train"
    for name in ("cat/b.png", "cat/a.jpg", "cat/deeper/c.PNG", "dog/z.jpeg"):
        solid(root / name)
    solid(root / "cat" / ".hidden.png")
    solid(root / ".thumbnails" / "x.png")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root
