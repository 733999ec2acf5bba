"""What the tests share: the project's folders, a folder of the test's own to run in, the flags of a short run.

The simulated GPU that ``lightning_kit.audit`` trains on is set up by lightning-kit's pytest
plugin, before the first test: nothing to do here.
"""

import contextlib
import os
import threading
from pathlib import Path

import pytest
from lightning_kit.building import build

from {{ cookiecutter.project_slug }}.cli import ProjectCLI

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT / "configs"
# Where train.py writes its runs, relative to the folder it runs in.
RUNS = Path("runs/lightning_logs")
# A guard against a hang, not a judge of speed: a test's subprocess that takes this long has stopped.
HANG_GUARD_S = 20 * 60


def refused(args: list[str], capsys: pytest.CaptureFixture | None = None) -> str:
    """The one line with which ``train.py args`` stops before anything is trained; fails when it does not.

    The parser itself (a value not of the argument's type) prints its line and exits with 2: pass ``capsys``.
    """
    with pytest.raises(SystemExit) as stop:
        build(ProjectCLI, args)
    message = capsys.readouterr().err.strip() if capsys is not None and stop.value.code == 2 else str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


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
    """train.py's flags for a short CPU run on offline data: a few batches of each stage."""
    return [
        *("--config", synthetic_config, "--accelerator", "cpu", "--trainer.enable_progress_bar", "false"),
        *("--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"),
        *("--trainer.limit_test_batches", "2", "--trainer.limit_predict_batches", "2"),
    ]


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
