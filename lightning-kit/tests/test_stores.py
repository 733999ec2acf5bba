"""A study's store under faults (``lightning_kit.stores``, ``sweep/store.py``, the dashboard's reading of it): every
store and file-system error ends in one line naming the file or URL and what to do, never a traceback or a hang; a
study's file is never written through a link, and a file the dashboard only reads is opened read-only, each query
time-bound.

Read-only folders and full disks are real: a small tmpfs mounted for the test (root only, else skipped) or, as
another user, permissions; the file size limit is the process's own (``RLIMIT_FSIZE``, as ``ulimit -f`` sets it)."""

import contextlib
import json
import os
import resource
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import HANG_GUARD_S, exit_message, refused
from image_project.cli import ProjectCLI

from lightning_kit.sweep.command import main as sweep_main
from lightning_kit.views import main as views_main

STUDY = Path("runs/sweeps/lr")


def main(args: list[str]) -> None:
    sweep_main(args, cli_class=ProjectCLI)


@pytest.fixture(scope="module")
def short_trials(fast_args) -> list[str]:
    return [*fast_args, "--max_epochs", "1", "--trainer.enable_model_summary", "false"]


@pytest.fixture
def space(in_tmp_path) -> list[str]:
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.002]\n")
    return ["--space", "lr.yaml", "--trials", "1"]


def one_line(message: str) -> str:
    assert message.startswith("error: ") and "\n" not in message.strip() and "Traceback" not in message, message
    return message


def real_study(path: Path, trials: int = 3) -> Path:
    """An SQLite file holding an Optuna study ``lr`` of a few trials."""
    path.parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(study_name="lr", storage=storage)
    study.optimize(lambda trial: trial.suggest_float("model.lr", 1e-3, 1e-2), n_trials=trials)
    storage.engine.dispose()  # no file left open (a file system with one open for writing cannot turn read-only)
    return path


def _corrupt(kind: str, path: Path) -> None:
    if kind == "random bytes":
        path.write_bytes(os.urandom(64 * 1024))
    elif kind == "truncated":
        whole = real_study(path.with_name("whole.db")).read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif kind == "a text file":
        path.write_text("model.lr: 0.1\n")
    elif kind == "a folder":
        path.mkdir()


@pytest.mark.parametrize("kind", ["random bytes", "truncated", "a text file", "a folder"])
def test_a_study_db_that_holds_no_study_ends_in_one_line_and_is_left_alone(space, short_trials, kind):
    """study.db beside the trials, corrupt, cut short, of another kind or a folder: one line naming it, untouched."""
    path = STUDY / "study.db"
    path.parent.mkdir(parents=True)
    _corrupt(kind, path)
    before = path.read_bytes() if path.is_file() else None
    message = one_line(exit_message(main, *space, *short_trials))
    assert str(path.resolve()) in message, message
    assert any(words in message for words in ("not an SQLite database", "not a whole SQLite database", "a folder"))
    assert (path.read_bytes() if path.is_file() else None) == before
    assert not list(STUDY.glob("trial_*"))


def test_a_study_db_that_links_out_of_the_sweep_folder_is_refused_not_written_through(space, short_trials, tmp_path):
    """A link planted at study.db, to a study elsewhere: refused by name, and the file it points to stays as it was."""
    target = real_study(tmp_path / "elsewhere" / "other.db")
    before = target.read_bytes()
    STUDY.mkdir(parents=True)
    (STUDY / "study.db").symlink_to(target)
    message = one_line(exit_message(main, *space, *short_trials))
    assert "study.db" in message and "is a link" in message, message
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["other.db"]  # no journal was made beside it


@pytest.mark.parametrize("companion", ["study.db-journal", "study.db-wal"])
def test_a_link_planted_beside_study_db_is_refused_not_written_through(space, short_trials, tmp_path, companion):
    """SQLite writes its journal beside the file, following links: a link planted at that name is refused by name."""
    target = tmp_path / "elsewhere" / "precious"
    target.parent.mkdir()
    target.write_bytes(b"not to be overwritten")
    STUDY.mkdir(parents=True)
    (STUDY / companion).symlink_to(target)
    message = one_line(exit_message(main, *space, *short_trials))
    assert f"{companion} beside it is a link" in message, message
    assert target.read_bytes() == b"not to be overwritten"


def test_a_study_db_that_is_a_fifo_is_refused_without_waiting(space, short_trials, make_fifo):
    make_fifo(STUDY / "study.db")
    message = one_line(exit_message(main, *space, *short_trials))
    assert "study.db" in message and "FIFO" in message, message


def test_a_space_file_that_is_a_fifo_is_refused_without_waiting(in_tmp_path, short_trials, make_fifo):
    """--space goes through the same checks as --config: a FIFO is refused by name, never waited on."""
    make_fifo(in_tmp_path / "lr.yaml")
    message = one_line(exit_message(main, "--space", "lr.yaml", "--trials", "1", *short_trials))
    assert "lr.yaml is a FIFO" in message, message


@pytest.mark.parametrize(
    ("storage", "said"),
    [
        ("sqlite:////proc/no-such-folder/study.db", "its folder cannot be made"),
        ("sqlite:///{file}/study.db", "cannot"),
        ("sqlite:///{folder}", "is a folder, not a file"),
        ("sqlite://", "an SQLite study needs a file"),
        ("postgresql+psycopg://team@127.0.0.1:99999/studies", "port"),
        ("postgresql+psycopg://team@127.0.0.1:port/studies", "is not a database URL"),
    ],
)
def test_a_storage_that_cannot_be_written_or_reached_ends_in_one_line(space, short_trials, tmp_path, storage, said):
    """A --storage in a folder that cannot be made, under a file, at a folder, in memory, or with a bad port."""
    (tmp_path / "a-file").write_text("")
    storage = storage.format(file=tmp_path / "a-file", folder=tmp_path)
    message = one_line(exit_message(main, *space, "--storage", storage, *short_trials))
    assert message.startswith("error: --storage ") and said in message, message


def _mount_tmpfs(folder: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``folder``: True when it could (root, with mount allowed)."""
    if os.geteuid() != 0:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A folder on a disk of its own, 512 KiB, unmounted at the end; skipped where it cannot be mounted."""
    folder = tmp_path / "disk"
    if not _mount_tmpfs(folder, "512k"):
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


def test_a_study_on_a_full_disk_ends_in_one_line(space, short_trials, small_disk):
    """The store's disk has no room left: one line naming the store, saying the disk is full."""
    with contextlib.suppress(OSError), (small_disk / "filler").open("wb") as filler:
        while True:
            filler.write(b"\0" * 65536)
    storage = f"sqlite:///{small_disk / 'study.db'}"
    message = one_line(exit_message(main, *space, "--storage", storage, *short_trials))
    assert message.startswith(f"error: --storage {storage}") and "the disk is full" in message, message


@pytest.mark.parametrize("made", ["file", "folder"])
def test_a_read_only_study_ends_in_one_line(space, short_trials, small_disk, made):
    """A study's file on a read-only file system (its file there, or only its folder): one line saying so."""
    path = small_disk / "study.db"
    if made == "file":
        real_study(path, trials=1)
    _remount(small_disk, "ro")
    try:
        message = one_line(exit_message(main, *space, "--storage", f"sqlite:///{path}", *short_trials))
    finally:
        _remount(small_disk, "rw")
    assert "read-only" in message and str(path) in message, message


def test_a_study_past_the_file_size_limit_ends_in_one_line(in_tmp_path, short_trials):
    """Under ``ulimit -f`` too small for a study's tables, the sweep, in a process of its own, ends in one line."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    sweep = subprocess.run(
        [sys.executable, "-m", "image_project.sweep", "--space", "lr.yaml", "--trials", "1", *short_trials],
        cwd=in_tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=limited,
    )
    message = one_line(sweep.stderr.strip())
    assert sweep.returncode == 1 and "study.db" in message and "ulimit -f" in message, message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("model.lr: {low: 1.0e-300, high: 1.0e+300, log: true}\n", "model.lr: low: 1e-300 is beyond"),
        ("model.lr: {low: 1.0e-3, high: 1.0e+300}\n", "model.lr: high: 1e+300 is beyond"),
        ("model.lr: {low: .nan, high: 0.1}\n", "model.lr: low, high and step must be finite numbers"),
        ("model.lr: {low: 0.001, high: .inf}\n", "model.lr: low, high and step must be finite numbers"),
        ("model.lr: [0.001, .nan]\n", "model.lr: a choice is refused: nan is not a finite number"),
        ("model.lr: [0.001, 1.0e+300]\n", "model.lr: a choice is refused: 1e+300 is beyond"),
        ("data.batch_size: {low: 1, high: 100000000000000000000}\n", "beyond what a 64-bit integer holds"),
    ],
)
def test_a_space_of_numbers_no_model_can_use_ends_in_one_line(in_tmp_path, short_trials, text, said):
    """NaN, infinity and ranges past what a model's float32 numbers (or a 64-bit integer) hold are refused up front,
    naming the file and the key, before the optimizer meets them."""
    (in_tmp_path / "space.yaml").write_text(text)
    message = one_line(exit_message(main, "--space", "space.yaml", "--trials", "1", *short_trials))
    assert message.startswith("error: space.yaml: ") and said in message, message


@pytest.mark.parametrize(
    "option",
    [["--prune_after", "nan"], ["--prune_after", "inf"], ["--trials", "nan"], ["--trials", "1e4"], ["--folds", "inf"]],
)
def test_a_numeric_sweep_option_that_is_no_number_ends_in_one_line(space, short_trials, option, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*space[:2], *option, *short_trials])
    assert stop.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith(f"error: argument {option[0]}: invalid int from ") and "\n" not in message, message


@pytest.mark.parametrize("option", [["--folds", "1000000000"], ["--trials", str(10**30)]])
def test_a_sweep_option_past_any_sweep_ends_in_one_line(space, short_trials, option, capsys):
    args = option if option[0] == "--folds" else [*space[:2], *option]
    with pytest.raises(SystemExit):
        main([*args, *short_trials])
    message = capsys.readouterr().err.strip()
    bound = "2 to 10000" if option[0] == "--folds" else "1 to 1000000"
    assert message.startswith(f"error: argument {option[0]}: invalid int from {bound} value") and "\n" not in message


@pytest.mark.parametrize("devices", ["-1", "[0, 1]"])
def test_devices_for_gpus_on_the_cpu_end_in_one_line(in_tmp_path, fast_args, devices, capsys):
    """-1 (all) and lists of indices are for GPUs: on the CPU, Lightning's TypeError becomes a line naming --devices."""
    message = refused([*fast_args, "--devices", devices], capsys)
    assert message.startswith("error: --devices on the CPU is a number of processes"), message


# The dashboard (views dashboard FOLDER), reading a sweep folder's study.db.


def sweep_folder(root: Path) -> Path:
    """A sweep folder under ``root``: study.json, a study.db of a study of 3 trials, and one trial's run folder."""
    folder = root / "sweeps" / "lr"
    real_study(folder / "study.db")
    (folder / "study.json").write_text(
        json.dumps({"study_name": "lr", "storage": "sqlite", "monitor": "val/acc", "direction": "maximize"})
    )
    run = folder / "trial_0000"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  lr: 0.001\n")
    (run / "run.json").write_text(json.dumps({"status": "finished", "started": "2026-12-01T10:00:00+00:00"}))
    return folder


def refused_view(folder: Path, capsys) -> str:
    """What ``views dashboard FOLDER`` says refusing a sweep's study it cannot read: one line, no traceback."""
    with pytest.raises(SystemExit) as stop:
        views_main(["dashboard", str(folder)])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def untouched(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def test_the_dashboard_reads_a_study_without_writing_to_its_folder(tmp_path, capsys):
    """The whole study read (then a port in use stops it before serving): the folder's files as they were."""
    folder = sweep_folder(tmp_path / "runs")
    before = untouched(folder)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit):
            views_main(["dashboard", str(folder), "--port", str(port)])
    assert f"--port {port} is in use" in capsys.readouterr().err
    assert untouched(folder) == before


def test_the_dashboard_opens_a_study_read_only(tmp_path, capsys):
    """A study.db lacking what Optuna would add (its version row) is not written to: one line, the file as it was."""
    folder = sweep_folder(tmp_path / "runs")
    with contextlib.closing(sqlite3.connect(folder / "study.db")) as connection, connection:
        connection.execute("DELETE FROM version_info")
    before = untouched(folder)
    err = refused_view(folder, capsys)
    assert "cannot be shown" in err and "opened read-only" in err, err
    assert untouched(folder) == before


def test_a_study_whose_schema_loops_cannot_hang_the_dashboard(tmp_path):
    """A recursive view in place of one of Optuna's tables: each query is time-bound, and the study is one line."""
    folder = sweep_folder(tmp_path / "runs")
    with contextlib.closing(sqlite3.connect(folder / "study.db")) as connection:
        connection.executescript(
            "DROP TABLE trial_values; CREATE VIEW trial_values AS WITH RECURSIVE r(x) AS "
            "(SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x AS trial_value_id, x AS trial_id, 0 AS objective, "
            "1.0 AS value, 'FINITE' AS value_type FROM r;"
        )
    # In a process of its own: a hang fails the test at the guard instead of stopping the suite.
    view = subprocess.run(
        [sys.executable, "-m", "lightning_kit.views", "dashboard", str(folder)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert view.returncode == 1 and "Traceback" not in view.stderr, view.stderr
    assert "study lr cannot be read" in view.stderr and "time bound" in view.stderr, view.stderr


_HALF_WRITTEN = """
import os, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("PRAGMA cache_size = 1")  # every changed page goes to the file at once, the journal first
connection.execute("BEGIN IMMEDIATE")
connection.execute("UPDATE trials SET state = 'FAIL'")
connection.execute("INSERT INTO studies (study_name) SELECT 'x' || trial_id FROM trials")
os.kill(os.getpid(), 9)
"""


def test_a_study_left_half_written_by_a_killed_sweep_is_one_line_saying_what_to_do(tmp_path, capsys):
    """kill -9 in the middle of a write leaves a journal that only a writer can undo: the dashboard, which only reads,
    says so, and leaves the file and its journal as they were."""
    folder = sweep_folder(tmp_path / "runs")
    subprocess.run([sys.executable, "-c", _HALF_WRITTEN, str(folder / "study.db")], timeout=HANG_GUARD_S)
    assert (folder / "study.db-journal").stat().st_size > 0
    before = untouched(folder)
    err = refused_view(folder, capsys)
    assert "run the sweep again" in err, err
    assert untouched(folder) == before


@pytest.mark.parametrize("kind", ["random bytes", "truncated", "a text file"])
def test_a_corrupt_study_is_one_line_of_the_dashboard(tmp_path, capsys, kind):
    folder = sweep_folder(tmp_path / "runs")
    (folder / "study.db").unlink()
    _corrupt(kind, folder / "study.db")
    (folder / "whole.db").unlink(missing_ok=True)
    before = untouched(folder)
    err = refused_view(folder, capsys)
    assert "SQLite database" in err, err
    assert untouched(folder) == before


def test_a_study_db_that_is_a_fifo_is_not_read_by_the_dashboard(tmp_path, capsys, make_fifo):
    folder = sweep_folder(tmp_path / "runs")
    (folder / "study.db").unlink()
    make_fifo(folder / "study.db")
    err = refused_view(folder, capsys)
    assert "not in study.db there" in err, err
