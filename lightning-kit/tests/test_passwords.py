"""Passwords are never shown or stored (``lightning_kit.passwords``): a password planted in a ``--storage`` URL appears
in no output and no file of a sweep, a table of runs or a failure, whatever form the URL takes.

The sweep runs against a PostgreSQL server of this test that checks passwords (SCRAM), so the planted password is
the one that logs in; the failures are a wrong password, a closed port, a missing driver, a URL that does not
parse, and SQLite with a secret in its query."""

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import HANG_GUARD_S, _free_port, postgres_server
from image_project.cli import ProjectCLI

from lightning_kit import passwords
from lightning_kit.run_record import started_record
from lightning_kit.runs.command import main as runs_main
from lightning_kit.sweep.command import main as sweep_main
from lightning_kit.views import main as views_main

# A password with each character a URL treats specially; either token gives it away, in any encoding.
PASSWORD = "Hush@42:/%Kx9q"
TOKENS = ("Hush", "Kx9q")
ENCODED = quote(PASSWORD, safe="")


def leaked(text: str | bytes) -> list[str]:
    """The tokens of the planted password found in ``text``."""
    data = text.encode() if isinstance(text, str) else text
    return [token for token in TOKENS if token.encode() in data]


def files_leaking(folder: Path) -> list[str]:
    """Every file below ``folder`` (any kind: JSON, YAML, CSV, checkpoints, databases) that holds the password."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and leaked(path.read_bytes()):
            found.append(str(path.relative_to(folder)))
    return found


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        (f"postgresql+psycopg://team:{ENCODED}@127.0.0.1:5432/studies", "postgresql+psycopg://team:***@127.0.0.1:5432"),
        (f"postgresql+psycopg://team:{PASSWORD}@db.example:5432/studies", "postgresql+psycopg://team:***@"),
        ("postgresql://team:Hush:Kx9q@db/studies", "postgresql://team:***@db/studies"),
        ("postgresql://team:Hush/Kx9q@db/studies", "postgresql://team:***@db/studies"),
        ("postgresql://team:Hush%Kx9q@db/studies", "postgresql://team:***@db/studies"),
        ("postgresql://team:HushKx9q@db:notaport/studies", "postgresql://team:***@"),
        ("mysql+nosuchdriver://team:HushKx9q@db/studies", "mysql+nosuchdriver://team:***@db/studies"),
        ("postgresql://team@db/studies?password=HushKx9q&application_name=x", "application_name=x"),
        ("postgresql://team:Hush Kx9q@db/studies", "postgresql://team:***@"),
        ("sqlite:///study.db?password=HushKx9q", "sqlite:///study.db?password=***"),
        ("not a URL, but postgresql://team:HushKx9q@db/x in a sentence", "not a URL, but postgresql://team:***@db/x"),
    ],
)
def test_a_url_is_shown_without_its_password_in_any_form(url, kept):
    """Percent-encoded or not, with '@', ':', '/', '%' or a space in it, in a URL that does not parse or whose driver is
    missing, or as a query parameter: the password is hidden, and what identifies the store is kept."""
    for shown in (passwords.hidden(url), passwords.scrubbed(url), passwords.shown_command(["--storage", url])):
        assert not leaked(shown), shown
        assert kept in shown, shown


def test_a_url_without_its_scheme_is_shown_without_its_password():
    """A URL mistyped without its ``scheme://`` is refused by the message that shows it: its password hidden."""
    assert passwords.hidden("team:HushKx9q@db/studies?password=Kx9q") == "team:***@db/studies?password=***"
    assert passwords.hidden("team@db/studies") == "team@db/studies"


def test_a_url_without_a_password_is_shown_as_given():
    for url in ("sqlite:////tmp/a@b/study.db", "sqlite:///runs/study.db", "postgresql+psycopg://team@db:5432/studies"):
        assert passwords.hidden(url) == url


def test_a_remembered_password_is_hidden_wherever_it_appears():
    """A driver's message that quotes the password (not as a URL) is scrubbed once the URL was remembered."""
    passwords.remember(f"postgresql://team:{ENCODED}@db/studies")
    assert not leaked(passwords.scrubbed(f"FATAL: the password {PASSWORD} or {ENCODED} is wrong"))


def test_a_run_record_keeps_its_command_line_without_the_password(monkeypatch):
    """run.json's command is the process's own, --storage URL or --storage=URL included: recorded without it."""
    url = f"postgresql+psycopg://team:{ENCODED}@db/studies"
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--storage", url, f"--storage={url}", "--space", "lr.yaml"])
    record = started_record(None)
    assert not leaked(repr(record))
    assert record["command"][1:3] == ["sweep.py", "--storage"] and record["command"][-2:] == ["--space", "lr.yaml"]


@pytest.fixture(scope="module")
def password_server() -> Iterator[tuple[str, str]]:
    """A PostgreSQL server of this module that checks passwords: (URL of its empty database with the planted
    password, the same with a wrong one). Skipped where PostgreSQL or psycopg is missing."""
    with postgres_server("studies", password=PASSWORD) as port:
        yield (
            f"postgresql+psycopg://postgres:{ENCODED}@127.0.0.1:{port}/studies",
            f"postgresql+psycopg://postgres:Hush-wrong-Kx9q@127.0.0.1:{port}/studies",
        )


def run_module(folder: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` in ``folder``, its output (stdout and stderr apart) captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=folder,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


@pytest.fixture(scope="module")
def short_trials(fast_args) -> list[str]:
    return [*fast_args, "--max_epochs", "1", "--trainer.enable_model_summary", "false"]


@pytest.mark.slow
def test_a_sweep_and_its_table_show_and_store_no_password(password_server, tmp_path, short_trials):
    """A sweep whose --storage logs in with the planted password, then the table of runs (printed, and written as
    CSV and Markdown) and the dashboard reading that study, then a sweep stopped in a failure: the password is in no
    output and no file."""
    url, _ = password_server
    (tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")
    sweep = run_module(
        tmp_path, "image_project.sweep", "--space", "lr.yaml", "--trials", "1", "--storage", url, *short_trials
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "1 trials complete" in sweep.stdout
    table = run_module(tmp_path, "lightning_kit.runs", "runs", "--csv", "runs.csv", "--markdown", "runs.md")
    assert table.returncode == 0, table.stderr
    with socket.socket() as taken:  # the study read whole, through the password; then the port stops the server
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        view = run_module(tmp_path, "lightning_kit.views", "dashboard", "runs/sweeps/lr", "--storage", url,
                          "--port", str(port))  # fmt: skip
    assert view.returncode == 1 and view.stderr == f"error: --port {port} is in use on 127.0.0.1: give another --port\n"
    # A study started with other settings is refused, naming the store.
    (tmp_path / "lr.yaml").write_text("model.lr: [0.01]\n")
    refused = run_module(
        tmp_path, "image_project.sweep", "--space", "lr.yaml", "--trials", "1", "--storage", url, *short_trials
    )
    assert refused.returncode == 1 and "postgresql+psycopg://postgres:***@127.0.0.1" in refused.stderr
    for process in (sweep, table, view, refused):
        assert not leaked(process.stdout + process.stderr), process.stdout + process.stderr
        assert "Traceback" not in process.stderr
    assert files_leaking(tmp_path) == []
    assert (tmp_path / "runs" / "sweeps" / "lr" / "study.json").is_file()
    assert (tmp_path / "runs" / "sweeps" / "lr" / "trial_0000" / "run.json").is_file()


def run_in_process(main, args: list[str], capfd: pytest.CaptureFixture) -> tuple[object, str]:
    """``main(args)`` in this process, as a fresh one would run it (no password remembered from before): its exit
    code or message (0 when it returns) and everything it printed, on stdout and stderr, at the descriptors."""
    passwords._remembered.clear()
    capfd.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as stop:
        code = stop.code
    printed = capfd.readouterr()
    return code, printed.out + printed.err


def sweep(args: list[str]) -> None:
    """``python -m image_project.sweep args``."""
    sweep_main(args, cli_class=ProjectCLI)


@pytest.mark.parametrize(
    ("storage", "said"),
    [
        ("wrong password", "the server refused the user name or password"),
        (f"postgresql+psycopg://postgres:{ENCODED}@127.0.0.1:{{closed}}/studies", "the server cannot be reached"),
        (f"postgresql+nosuchdriver://postgres:{ENCODED}@127.0.0.1/studies", "the database driver for"),
        (f"postgresql+psycopg://postgres:{ENCODED}@127.0.0.1:port/studies", "is not a database URL"),
        (f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1/studies", "write an '@' in the user name or password"),
    ],
)
def test_a_store_that_fails_ends_in_one_line_without_the_password(
    password_server, in_tmp_path, capfd, short_trials, storage, said
):
    """A wrong password, a closed port (of this host), a driver not installed, a URL that does not parse, and a
    password with an unescaped '@': one line naming --storage, the password hidden, nothing written.

    In this process (the sweep in a process of its own, with its password, is the test above): what is checked is
    the message and what was printed and written, all of it the sweep's own."""
    if storage == "wrong password":
        storage = password_server[1]
    storage = storage.replace("{closed}", str(_free_port()))
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")
    args = ["--space", "lr.yaml", "--trials", "1", "--storage", storage, *short_trials]
    message, printed = run_in_process(sweep, args, capfd)
    assert isinstance(message, str), (message, printed)
    assert message.startswith("error: --storage ") and said in message, message
    assert "\n" not in message and printed.strip() == "", (message, printed)
    assert not leaked(message), message
    assert files_leaking(in_tmp_path) == []
    # The dashboard of a sweep folder whose study is in that store: one line, the password hidden.
    listed = in_tmp_path / "listed" / "sweeps" / "lr"
    (listed / "trial_0000").mkdir(parents=True)
    (listed / "study.json").write_text('{"study_name": "lr", "storage": "the team\'s server"}')
    (listed / "trial_0000" / "config.yaml").write_text("model:\n  lr: 0.001\n")
    (listed / "trial_0000" / "run.json").write_text('{"status": "finished", "started": "2026-12-01T10:00:00+00:00"}')
    code, printed = run_in_process(views_main, ["dashboard", "listed/sweeps/lr", "--storage", storage], capfd)
    assert code == 1 and printed.startswith("error: ") and printed.count("\n") == 1, printed
    assert not leaked(printed), printed
    code, printed = run_in_process(runs_main, ["listed", "--csv", "listed.csv"], capfd)
    assert code == 0 and "Traceback" not in printed and not leaked(printed), printed
    assert files_leaking(in_tmp_path / "listed") == [] and not leaked((in_tmp_path / "listed.csv").read_text())


def test_a_sqlite_store_with_a_secret_in_its_query_records_none(in_tmp_path, capfd, short_trials):
    """SQLite takes no password, but a URL can still carry one in its query: study.json and run.json hold none."""
    storage = f"sqlite:///{in_tmp_path / 'shared.db'}?password=HushKx9q"
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")
    code, printed = run_in_process(
        sweep, ["--space", "lr.yaml", "--trials", "1", "--storage", storage, *short_trials], capfd
    )
    assert code == 0, printed
    assert not leaked(printed)
    assert files_leaking(in_tmp_path) == []
    assert "password=***" in (in_tmp_path / "runs" / "sweeps" / "lr" / "study.json").read_text()
