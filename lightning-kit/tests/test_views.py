"""A sweep in the browser (``python -m lightning_kit.views dashboard``): Optuna's dashboard started on 127.0.0.1 over a
real two-trial study, beside runs logged to MLflow too (``configs/mlflow.yaml``), and loaded in headless Chromium
(Debian's ``chromium``; skipped with a reason where it is absent, installed by CI): the test reads what a person would
see, and leaves a screenshot of each page in its folder. Then what the view refuses, in one line; and the default
logger's TensorBoard event files, which ``tensorboard --logdir runs`` reads."""

import contextlib
import csv
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import CONFIGS, HANG_GUARD_S, main

from lightning_kit.views import main as views_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# How long a view may take to start listening, and a page to render: bounds on a hang, not on speed.
START_S = 120
PAGE_S = 120
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium package)")


# A project's folder after a run logged to MLflow too, that run resumed for a second epoch, and a sweep of two
# trials (runs/sweeps/lr): one process, in that folder, as a person runs train.py there. (MLflow keeps one store per
# URI in a process: its relative sqlite:///runs/mlflow.db stays the first folder's in a process that trains in several.)
TRAINED = """
import sys
from image_project.cli import ProjectCLI, main
from lightning_kit.sweep.command import main as sweep_main

fast, mlflow = sys.argv[1:-2], sys.argv[-2:]
main([*fast, *mlflow, "--max_epochs", "1"])
main([*fast, *mlflow, "--max_epochs", "2", "--ckpt_path", "last"])
sweep_main([*fast, "--space", "lr.yaml", "--sampler", "grid", "--max_epochs", "1"], cli_class=ProjectCLI)
"""


def project_runs(folder: Path, fast_args: list[str]) -> Path:
    (folder / "lr.yaml").write_text("model.lr: [0.001, 0.002]\n")
    command = [sys.executable, "-c", TRAINED, *fast_args, "--config", str(CONFIGS / "mlflow.yaml")]
    run = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return folder


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(folder: Path, *args: str):
    """``python -m lightning_kit.views args --port P`` in ``folder``, until it listens; its port and its output's
    file. Stopped by SIGTERM at the end, which it ends with 0 (its process group killed if it outlives the guard)."""
    port = _free_port()
    log = folder / f"view-{args[0]}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "lightning_kit.views", *args, "--port", str(port)],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline, f"not listening after {START_S} s: {log.read_text()}"
            time.sleep(0.2)
        yield port, log
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(HANG_GUARD_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
    assert server.returncode == 0, f"SIGTERM did not stop it with 0: {log.read_text()[-3000:]}"


def seen(url: str, screenshot: Path, budget_ms: int = 15000) -> str:
    """The page at ``url`` as headless Chromium rendered it (its DOM, once its scripts have run for ``budget_ms`` of
    Chromium's virtual time), a screenshot of it written to ``screenshot``. A tall window: the cards of a page below
    its first screen are drawn too."""
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={screenshot.parent / 'chromium-profile'}", "--window-size=1400,2400",
        f"--virtual-time-budget={budget_ms}", f"--screenshot={screenshot}", "--dump-dom",
    ]  # fmt: skip
    page = subprocess.run(
        [CHROMIUM, *flags, url],
        capture_output=True,
        text=True,
        timeout=PAGE_S + budget_ms // 1000,
        stdin=subprocess.DEVNULL,
    )
    assert page.returncode == 0, page.stderr[-2000:]
    assert screenshot.stat().st_size > 0
    return page.stdout


@pytest.mark.slow
@needs_chromium
def test_the_dashboard_shows_in_a_browser_a_two_trial_sweep_beside_runs_logged_to_mlflow(tmp_path, fast_args):
    """One project folder (``project_runs``): what ``mlflow ui`` would show of it, then the dashboard over its sweep,
    loaded in Chromium."""
    pytest.importorskip("mlflow", reason="the runs are logged with MLflow's client (mlflow-skinny, the test extra)")
    (tmp_path / "project").mkdir()
    folder = project_runs(tmp_path / "project", fast_args)
    the_mlflow_config_logs_each_fit_to_the_sqlite_store(folder)
    the_dashboard_shows_the_studys_trials_values_and_run_folders(folder, tmp_path)


def the_dashboard_shows_the_studys_trials_values_and_run_folders(project_runs: Path, tmp_path: Path) -> None:
    """optuna-dashboard over the sweep's study.db: its two trials, the metric by name, their values and parameters,
    and what the runs table knows of each trial (its run folder, the command that trains it again)."""
    study = optuna.load_study(study_name="lr", storage=f"sqlite:///{project_runs / 'runs/sweeps/lr/study.db'}")
    assert study.metric_names == ["val/acc"]
    values = [f"{trial.value:.4f}"[:5] for trial in study.trials]
    before = (project_runs / "runs/sweeps/lr/study.db").read_bytes()
    with serving(project_runs, "dashboard", "runs/sweeps/lr") as (port, log):
        study_page = seen(f"http://127.0.0.1:{port}/dashboard/studies/1", tmp_path / "dashboard-study.png")
        trials_page = seen(f"http://127.0.0.1:{port}/dashboard/studies/1/trials", tmp_path / "dashboard-trials.png")
    assert "val/acc" in study_page and "History" in study_page, study_page[-3000:]
    assert "Trial 0" in trials_page and "Trial 1" in trials_page
    for shown in ("run_folder", "runs/sweeps/lr/trial_0000", "command", "model.lr", *values):
        assert shown in trials_page, shown
    said = log.read_text()
    assert said.splitlines()[:2] == [
        f"Optuna's dashboard of study lr (2 trials) in sqlite:///{(project_runs / 'runs/sweeps/lr/study.db').resolve()}"
        ", read-only:",
        f"  http://127.0.0.1:{port}/dashboard/studies/1",
    ], said
    assert (project_runs / "runs/sweeps/lr/study.db").read_bytes() == before, "it only reads the study"


def the_mlflow_config_logs_each_fit_to_the_sqlite_store(project_runs: Path) -> None:
    """configs/mlflow.yaml logged both fits (the first and its resumption) to runs/mlflow.db, in its experiment, each
    with its metrics: what ``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`` shows."""
    database = sqlite3.connect(f"file:{project_runs / 'runs/mlflow.db'}?mode=ro", uri=True)
    with contextlib.closing(database):
        experiment = database.execute("SELECT experiment_id FROM experiments WHERE name = 'lightning_logs'").fetchone()
        runs = database.execute("SELECT run_uuid, status FROM runs ORDER BY start_time").fetchall()
        metrics = database.execute("SELECT DISTINCT run_uuid, key FROM metrics").fetchall()
    assert experiment is not None and [status for _, status in runs] == ["FINISHED", "FINISHED"], runs
    for run, _ in runs:
        assert {"val/acc", "val/loss", "train/loss"} <= {key for uuid, key in metrics if uuid == run}, metrics


def test_the_default_logger_writes_tensorboards_events_of_the_csvs_metrics_in_the_run_folder(trained_once):
    """One run folder, one version: TensorBoard's event file holds every metric of metrics.csv, at the same steps and
    values, and no placeholder `hp_metric`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = trained_once / "runs/lightning_logs/version_0"
    assert [path.name for path in (trained_once / "runs/lightning_logs").iterdir()] == ["version_0"]
    events = EventAccumulator(str(run))
    events.Reload()
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    logged = {(name, int(row["step"]), float(value)) for row in rows for name, value in row.items() if value}
    logged = {(name, step, value) for name, step, value in logged if name != "step"}
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted({name for name, _, _ in logged}) and "hp_metric" not in tags
    seen_there = {(tag, event.step, event.value) for tag in tags for event in events.Scalars(tag)}
    assert {(n, s, round(v, 5)) for n, s, v in seen_there} == {(n, s, round(v, 5)) for n, s, v in logged}


def test_without_tensorboard_the_logger_writes_the_csv_files_alone(in_tmp_path, fast_args):
    main([*fast_args, "--max_epochs", "1", "--trainer.logger.init_args.tensorboard", "false"])
    run = in_tmp_path / "runs/lightning_logs/version_0"
    assert (run / "metrics.csv").is_file() and not list(run.glob("events.out.tfevents.*"))


# What the view refuses: (the arguments, after the folder's set-up; the line's start).
def _a_file(folder: Path) -> list[str]:
    (folder / "runs").write_text("not a folder")
    return ["dashboard", "runs"]


def _no_study_file(folder: Path) -> list[str]:
    (folder / "runs/sweeps/lr").mkdir(parents=True)
    return ["dashboard", "runs/sweeps/lr"]


def _a_study(folder: Path) -> str:
    """The URL of a store in ``folder`` holding one study, ``other``."""
    optuna.create_study(study_name="other", storage=f"sqlite:///{folder / 'store.db'}")
    return f"sqlite:///{folder / 'store.db'}"


def _other_study(folder: Path) -> list[str]:
    return ["dashboard", "--storage", _a_study(folder), "--study", "lr"]


def _empty_store(folder: Path) -> list[str]:
    return ["dashboard", "--storage", f"sqlite:///{folder / 'none.db'}"]


def _not_a_database(folder: Path) -> list[str]:
    (folder / "store.db").write_bytes(b"\x00garbage" * 100)
    return ["dashboard", "--storage", f"sqlite:///{folder / 'store.db'}"]


def _unreachable(folder: Path) -> list[str]:
    return ["dashboard", "--storage", f"postgresql+psycopg://user:hunter2secret@127.0.0.1:{_free_port()}/db"]


def _broken_study_db(folder: Path) -> list[str]:
    (folder / "runs/sweeps/lr").mkdir(parents=True)
    (folder / "runs/sweeps/lr/study.json").write_text('{"study_name": "lr", "storage": "sqlite:///study.db"}')
    (folder / "runs/sweeps/lr/study.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    return ["dashboard", "runs/sweeps/lr"]


def _study_file_linked_outside(folder: Path) -> list[str]:
    (folder / "runs/sweeps/lr").mkdir(parents=True)
    (folder / "elsewhere.json").write_text('{"study_name": "lr"}')
    (folder / "runs/sweeps/lr/study.json").symlink_to(folder / "elsewhere.json")
    return ["dashboard", "runs/sweeps/lr"]


def _unknown_host(folder: Path) -> list[str]:
    return ["dashboard", "--storage", _a_study(folder), "--host", "no-such-host.invalid"]


def _nothing(folder: Path) -> list[str]:
    return ["dashboard"]


REFUSED = {
    "no folder": (lambda folder: ["dashboard", "elsewhere"], "error: FOLDER elsewhere does not exist"),
    "a file for the folder": (_a_file, "error: FOLDER runs is not a folder"),
    "no sweep there": (_no_study_file, "error: FOLDER runs/sweeps/lr holds no study.json"),
    "no folder nor store": (_nothing, "error: give a sweep's FOLDER"),
    "a study that is not there": (_other_study, "error: --study lr is not in sqlite:///"),
    "a store file that is not there": (_empty_store, "error: --storage sqlite:///"),
    "a store that is no database": (_not_a_database, "error: --storage sqlite:///"),
    "a store that cannot be reached": (_unreachable, "error: --storage postgresql+psycopg://user:***@127.0.0.1:"),
    "a sweep's study.db that is broken": (_broken_study_db, "error: the sweep in runs/sweeps/lr cannot be shown"),
    "a study.json linked outside": (_study_file_linked_outside, "error: the sweep in runs/sweeps/lr cannot be shown"),
    "an unknown host": (_unknown_host, "error: --host no-such-host.invalid is no address of this machine"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_the_view_refuses_bad_input_in_one_line(case, in_tmp_path, capsys):
    make, start = REFUSED[case]
    args = make(in_tmp_path)
    with pytest.raises(SystemExit) as stop:
        views_main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 1, err
    assert err.startswith(start) and err.count("\n") == 1, err
    assert "hunter2secret" not in err and "Traceback" not in err


def test_a_port_in_use_is_one_line(in_tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stop:
            views_main(["dashboard", "--storage", _a_study(in_tmp_path), "--port", str(port)])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err == f"error: --port {port} is in use on 127.0.0.1: give another --port\n"


@pytest.mark.parametrize("port", ["0", "65536", "http", "-1"])
def test_a_port_out_of_range_is_one_line(port, capsys):
    with pytest.raises(SystemExit) as stop:
        views_main(["dashboard", "--port", port])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "expected a port number from 1 to 65535" in err[-1], err


def test_a_view_that_is_the_tools_own_command_is_one_line_and_the_help_names_it(capsys):
    """TensorBoard and MLflow's UI have no launcher here: asking for one is argparse's one line, and ``--help`` gives
    the tool's own command."""
    with pytest.raises(SystemExit) as stop:
        views_main(["tensorboard"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'tensorboard'" in err, err
    with pytest.raises(SystemExit):
        views_main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "tensorboard --logdir runs" in said and "mlflow ui --backend-store-uri sqlite:///runs/mlflow.db" in said
