"""The table of runs (python -m lightning_kit.runs) and the status record every run writes (run.json)."""

import csv
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from conftest import HANG_GUARD_S, PROJECT
from image_project.cli import main as train

from lightning_kit.files import TEMPORARY_PREFIX
from lightning_kit.run_record import RUN_FILE, process_token, write_record
from lightning_kit.runs.command import main as runs


class FailAt(L.Callback):
    """A bug in the run's own code, in its second training step."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:
            raise RuntimeError("a bug in the second step")


@pytest.fixture(scope="module")
def experiments(tmp_path_factory, fast_args) -> Path:
    """Real runs: one finished (and tested), one diverged, one stopped by SIGTERM, one failed by a bug."""
    folder = tmp_path_factory.mktemp("experiments")
    runs_dir = folder / "runs" / "lightning_logs"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        fit = [*fast_args, "--max_epochs", "2"]
        train(fit)
        with pytest.raises(SystemExit, match="diverged"):
            train([*fit, "--model.lr", "1e9"])
        stop = ["--trainer.callbacks+=conftest.SignalAt", "--trainer.callbacks.init_args.train_batch", "1"]
        with pytest.raises(SystemExit, match="stopped by Ctrl-C or SIGTERM"):
            train([*fit, *stop])
        with pytest.raises(RuntimeError, match="a bug"):
            train([*fit, "--trainer.callbacks+=test_runs.FailAt"])
        best = next((runs_dir / "version_0" / "checkpoints").glob("best-*.ckpt"))
        train(["test", "--ckpt_path", str(best), *fast_args])
    return folder


def table(capsys, *args: str) -> list[dict[str, str]]:
    """The rows of ``python -m ...runs --format csv args``."""
    runs([*args, "--format", "csv"])
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def refused(capsys, *args: str) -> str:
    """The one line with which ``python -m ...runs args`` stops."""
    with pytest.raises(SystemExit) as exit_info:
        runs(list(args))
    message = capsys.readouterr().err
    assert exit_info.value.code != 0 and message.startswith("error: ") and "\n" not in message.strip(), message
    return message


def hand_made(folder: Path, lr: float = 0.001, accuracies=(0.5, 0.7, 0.6), record: dict | None = None) -> Path:
    """A run folder as fit writes it: config.yaml, metrics.csv (one validation row per epoch) and run.json."""
    folder.mkdir(parents=True)
    config = {"model": {"lr": lr}, "data": {"class_path": "some.Data", "init_args": {"batch_size": 64}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    rows = "".join(f"{epoch},{epoch},{acc},{1 - acc}\n" for epoch, acc in enumerate(accuracies))
    (folder / "metrics.csv").write_text("epoch,step,val/acc,val/loss\n" + rows)
    started = "2026-01-01T10:00:00+00:00"
    record = {"status": "finished", "started": started, "host": "elsewhere", "pid": 1, **(record or {})}
    (folder / RUN_FILE).write_text(json.dumps(record))
    return folder


@pytest.mark.slow
def test_real_runs_show_their_status_best_epoch_and_test(experiments, capsys, monkeypatch):
    """Real runs: finished, diverged, interrupted and failed each say so; the best epoch and its metrics are those
    of the best checkpoint; the test metrics attach to the run tested, whose evaluation is no row of its own."""
    monkeypatch.chdir(experiments)
    rows = {row["run"]: row for row in table(capsys)}
    assert list(rows) == [f"lightning_logs/version_{k}" for k in range(4)]
    assert [row["status"] for row in rows.values()] == ["finished", "diverged", "interrupted", "failed"]
    assert "RuntimeError: a bug in the second step" in rows["lightning_logs/version_3"]["note"]
    first = rows["lightning_logs/version_0"]
    record = json.loads(Path("runs/lightning_logs/version_0/run.json").read_text())
    assert record["status"] == "finished" and record["pid"] == os.getpid() and record["duration_s"] > 0
    assert Path(first["checkpoint"]).is_file() and f"best-epoch={first['best_epoch']}-" in first["checkpoint"]
    assert Path(record["best_checkpoint"]).name == Path(first["checkpoint"]).name
    with open("runs/lightning_logs/version_0/metrics.csv") as file:
        accuracies = {int(row["epoch"]): float(row["val/acc"]) for row in csv.DictReader(file) if row["val/acc"]}
    best = max(sorted(accuracies), key=accuracies.get)
    assert int(first["best_epoch"]) == best and float(first["val/acc"]) == accuracies[best]
    assert float(first["test/acc"]) >= 0 and rows["lightning_logs/version_2"]["test/acc"] == ""
    assert Path("runs/lightning_logs/version_2/checkpoints/on_exception.ckpt").is_file()


@pytest.mark.slow
def test_only_the_settings_that_differ_are_columns(experiments, capsys, monkeypatch):
    """model.lr differs between the runs and is a column; the batch size and the epochs, the same in all, and the
    logger's folder (a place, not a setting) are not; the text table lines up its columns."""
    monkeypatch.chdir(experiments)
    columns = list(table(capsys)[0])
    assert "model.lr" in columns
    assert not [column for column in columns if column.startswith(("data.", "trainer.logger", "trainer.max_epochs"))]
    runs([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "started", "status"]
    assert lines[0].index("status") == lines[1].index("finished")


def test_statuses_of_running_runs_follow_their_process(tmp_path, capsys):
    """A run recorded as running is running while its process lives; a process gone, or the id now another
    process's, is a killed run: interrupted. A run on another host cannot be asked: unknown."""
    here = {"status": "running", "host": socket.gethostname()}
    hand_made(tmp_path / "alive", record={**here, "pid": os.getpid(), "process": process_token(os.getpid())})
    gone = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    gone.wait(timeout=HANG_GUARD_S)
    hand_made(tmp_path / "gone", record={**here, "pid": gone.pid, "process": "boot:1"})
    hand_made(tmp_path / "reused", record={**here, "pid": os.getpid(), "process": "another boot:1"})
    hand_made(tmp_path / "remote", record={**here, "host": "not-" + socket.gethostname(), "pid": os.getpid()})
    rows = {row["run"]: row for row in table(capsys, str(tmp_path))}
    assert rows["alive"]["status"] == "running"
    assert rows["gone"]["status"] == rows["reused"]["status"] == "interrupted"
    assert "killed" in rows["gone"]["note"]
    assert rows["remote"]["status"] == "unknown"


def test_files_that_cannot_be_read_make_one_row_say_so(tmp_path, capsys, make_fifo):
    """A damaged metrics.csv, config.yaml or run.json, a FIFO, aliases expanding without end, a link out of the
    folder: each makes its own row say which file and why, and every other row is whole. Control characters a
    record carries (a terminal's escapes) are not printed."""
    hand_made(tmp_path / "fine")
    hand_made(tmp_path / "escapes", record={"status": "failed", "error": "boom\x1b[2J\nsecond line"})
    (hand_made(tmp_path / "metrics") / "metrics.csv").write_text("epoch,step,val/acc\n0,0,not a number\n")
    (hand_made(tmp_path / "config") / "config.yaml").write_text("model: [unclosed\n")
    (hand_made(tmp_path / "record") / RUN_FILE).write_text('{"status": "finish')
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + k)}: &{chr(98 + k)} [{', '.join([f'*{chr(97 + k)}'] * 10)}]\n" for k in range(6)
    )
    (hand_made(tmp_path / "aliases") / "config.yaml").write_text(bomb)
    (hand_made(tmp_path / "fifo") / "metrics.csv").unlink()
    make_fifo(tmp_path / "fifo" / "metrics.csv")
    outside = hand_made(tmp_path.parent / f"{tmp_path.name}-outside")
    (hand_made(tmp_path / "linked") / "config.yaml").unlink()
    (tmp_path / "linked" / "config.yaml").symlink_to(outside / "config.yaml")
    (tmp_path / "elsewhere").symlink_to(outside, target_is_directory=True)
    rows = {row["run"]: row for row in table(capsys, str(tmp_path))}
    assert list(rows) == ["aliases", "config", "escapes", "fifo", "fine", "linked", "metrics", "record"]
    assert rows["escapes"]["note"] == "boom?[2J?second line"
    assert rows["fine"]["note"] == "" and rows["fine"]["val/acc"] == "0.7"
    assert "metrics.csv unreadable: line 2" in rows["metrics"]["note"]
    assert "config.yaml unreadable" in rows["config"]["note"]
    assert rows["record"]["status"] == "unreadable" and "run.json" in rows["record"]["note"]
    assert "config.yaml unreadable: " in rows["aliases"]["note"] and "expand to over" in rows["aliases"]["note"]
    assert "metrics.csv unreadable" in rows["fifo"]["note"] and "FIFO" in rows["fifo"]["note"]
    assert "links outside" in rows["linked"]["note"]
    runs([str(tmp_path)])
    assert f"elsewhere links to {outside}, outside {tmp_path}: not followed" in capsys.readouterr().err


def test_sorting_filtering_and_the_files_written(tmp_path, capsys):
    """--sort orders by any column, -COLUMN largest first, empty cells last; --status filters; CSV and Markdown
    files parse and are never overwritten without --overwrite."""
    hand_made(tmp_path / "runs" / "a", lr=0.1, accuracies=(0.2, 0.3))
    hand_made(tmp_path / "runs" / "b", lr=0.01, accuracies=(0.9, 0.8))
    hand_made(tmp_path / "runs" / "c", lr=0.001, accuracies=(0.4,), record={"status": "failed"})
    (tmp_path / "runs" / "c" / "metrics.csv").write_text("epoch,step,val/acc,val/loss\n")
    folder = str(tmp_path / "runs")
    assert [row["run"] for row in table(capsys, folder, "--sort", "model.lr")] == ["c", "b", "a"]
    assert [row["run"] for row in table(capsys, folder, "--sort", "-val/acc")] == ["b", "a", "c"]
    assert [row["run"] for row in table(capsys, folder, "--sort", "val/acc")] == ["a", "b", "c"]
    assert [row["run"] for row in table(capsys, folder, "--status", "failed")] == ["c"]
    out = tmp_path / "out"
    runs([folder, "--csv", str(out / "t.csv"), "--markdown", str(out / "t.md")])
    capsys.readouterr()
    assert [row["model.lr"] for row in csv.DictReader((out / "t.csv").open())] == ["0.1", "0.01", "0.001"]
    markdown = (out / "t.md").read_text().splitlines()
    assert markdown[0].startswith("| run |") and set(markdown[1]) <= set("|- ") and len(markdown) == 5
    assert "exists" in refused(capsys, folder, "--csv", str(out / "t.csv"))
    runs([folder, "--csv", str(out / "t.csv"), "--overwrite", "--status", "failed"])
    assert len((out / "t.csv").read_text().splitlines()) == 2


def make_sweep(sweep: Path) -> None:
    """A sweep folder as the sweep writes it: study.json and 5 trials' run folders (its study.db is not read)."""
    for number, lr in enumerate([1e-4, 1e-3, 1e-2, 5e-2, 1e-1]):
        hand_made(sweep / f"trial_{number:04d}", lr=lr, accuracies=(0.4, 0.5 + lr))
    info = {"study_name": "lr", "storage": "sqlite:///elsewhere.db", "monitor": "val/acc", "direction": "maximize"}
    (sweep / "study.json").write_text(json.dumps({**info, "folds": None}))


def test_a_sweep_is_summed_up_below_the_table_and_its_study_is_the_dashboards(tmp_path, capsys):
    """A sweep folder's trials are rows like any run's; below the table, the sweep's trials by status, and the
    command that shows its study (each trial's state, each parameter's importance): Optuna's dashboard."""
    sweep = tmp_path / "runs" / "sweeps" / "lr"
    make_sweep(sweep)
    rows = table(capsys, str(tmp_path / "runs"))
    assert [row["run"] for row in rows] == [f"sweeps/lr/trial_{k:04d}" for k in range(5)]
    runs([str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert "sweep sweeps/lr (study lr, maximize val/acc): 5 trials, 5 finished" in out
    assert f"  its study, trial by trial: python -m lightning_kit.views dashboard {sweep}" in out


def test_the_record_is_replaced_whole_and_never_written_through_a_link(tmp_path):
    """run.json is written beside its name and renamed: an earlier record is replaced whole, and a link planted
    at the temporary name is replaced, not written through."""
    path = tmp_path / RUN_FILE
    write_record(path, {"status": "running", "padding": "x" * 10_000})
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / f"{TEMPORARY_PREFIX}{os.getpid()}.{RUN_FILE}").symlink_to(victim)
    write_record(path, {"status": "finished"})
    assert json.loads(path.read_text()) == {"status": "finished"}
    assert victim.read_text() == "untouched" and sorted(p.name for p in tmp_path.iterdir()) == [RUN_FILE, "victim"]


def test_mistakes_are_one_line(tmp_path, capsys):
    """A missing folder, a file given as the folder, a folder without runs, an unknown column, an unknown format,
    two outputs to one file: one line each."""
    assert "does not exist" in refused(capsys, str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("")
    assert "is not a folder" in refused(capsys, str(tmp_path / "file"))
    assert "no runs below" in refused(capsys, str(tmp_path))
    hand_made(tmp_path / "run")
    message = refused(capsys, str(tmp_path), "--sort", "lr")
    assert "--sort lr: not a column; accepted: run, started, status" in message
    assert "--format" in refused(capsys, str(tmp_path), "--format", "html")
    same = [str(tmp_path / "t.txt"), str(tmp_path / "run" / ".." / "t.txt")]
    assert "name the same file" in refused(capsys, str(tmp_path), "--csv", same[0], "--markdown", same[1])


def test_the_command_reads_runs_without_pytorch(tmp_path):
    """python -m ...runs lists runs without importing PyTorch, Lightning or Optuna (a sweep listed too)."""
    hand_made(tmp_path / "run")
    make_folds(tmp_path / "sweeps" / "folds")
    check = "import sys; from lightning_kit.runs.command import main; main(sys.argv[1:]); "
    check += "print(sorted(name for name in ('torch', 'lightning', 'optuna') if name in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]" and done.stdout.startswith("run ")


def test_the_command_names_itself_in_a_mistake(tmp_path, capsys):
    """``python -m lightning_kit.runs``, or a project's command that runs it (``prog``): a mistake names its --help."""
    done = subprocess.run(
        [sys.executable, "-m", "lightning_kit.runs", str(tmp_path), "--format", "html"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: argument --format"), done.stderr
    assert done.stderr.strip().endswith("(options: python -m lightning_kit.runs --help)"), done.stderr
    with pytest.raises(SystemExit):
        runs([str(tmp_path), "--format", "html"], prog="python -m my_project.runs")
    assert capsys.readouterr().err.strip().endswith("(options: python -m my_project.runs --help)")


def make_folds(sweep: Path, values=(0.6, 0.7, 0.8), tests=(0.55, 0.65, 0.75), failed: int | None = None) -> None:
    """A cross-validation's folder as ``sweep --folds 3`` writes it: trials that differ only in data.fold, each
    fold's run folder with a test of its checkpoint; fold ``failed`` failed."""
    for fold, (value, test) in enumerate(zip(values, tests, strict=True)):
        record = {"status": "failed", "error": "ValueError: fold"} if fold == failed else None
        run = hand_made(sweep / f"trial_{fold:04d}", accuracies=(0.4, value), record=record)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["data"]["init_args"].update(folds=3, fold=fold)
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "test" / "version_0").mkdir(parents=True)
        (run / "test" / "version_0" / "metrics.csv").write_text(f"epoch,step,test/acc\n0,0,{test}\n")
    info = {"study_name": "folds", "storage": "sqlite:///study.db", "monitor": "val/acc", "direction": "maximize"}
    (sweep / "study.json").write_text(json.dumps({**info, "folds": 3}))


def test_a_cross_validation_shows_its_folds_mean_and_spread_not_importances(tmp_path, capsys):
    """A sweep of ``--folds`` (its study.json says how many) is a cross-validation: below the table, the monitored and
    the test metrics' mean and standard deviation over the folds, each fold's value; no importance of data.fold."""
    make_folds(tmp_path / "runs" / "sweeps" / "folds")
    rows = table(capsys, str(tmp_path / "runs"))
    assert [row["data.fold"] for row in rows] == ["0", "1", "2"]
    runs([str(tmp_path / "runs")])
    out = capsys.readouterr().out
    study = "sweep sweeps/folds (study folds, cross-validation over 3 folds, maximize val/acc)"
    assert f"{study}: 3 trials, 3 finished" in out, out
    assert "  folds complete: 3 of 3\n" in out
    assert (
        "  val/acc (monitored): mean 0.7000, standard deviation 0.1000 over 3 folds (min 0.6000, max 0.8000; "
        "by fold 0: 0.6000, 1: 0.7000, 2: 0.8000)" in out
    ), out
    assert "  test/acc: mean 0.6500, standard deviation 0.1000 over 3 folds" in out, out
    assert "importance" not in out and "data.fold 1.00" not in out


def test_a_cross_validation_with_a_fold_missing_gives_no_mean(tmp_path, capsys):
    """A fold that failed: each complete fold's value is shown, and no mean, which would be of other data."""
    make_folds(tmp_path / "runs" / "sweeps" / "folds", failed=2)
    runs([str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert "  folds complete: 2 of 3; no mean until folds 2 complete" in out, out
    assert "  val/acc (monitored) by fold: 0: 0.6000, 1: 0.7000 (over 2 of 3 folds: no mean)" in out, out
    assert "mean 0." not in out


@pytest.mark.slow
def test_a_real_cross_validation_is_listed_as_folds(in_tmp_path, fast_args, capsys):
    """``sweep --folds 2``, then each fold's best checkpoint tested: the table of runs gives the folds' mean and
    spread of val/acc and test/acc, and no importance of data.fold."""
    from image_project.cli import ProjectCLI

    from lightning_kit.sweep.command import main as sweep

    sweep(["--folds", "2", *fast_args, "--max_epochs", "1", "--trainer.enable_model_summary", "false"], ProjectCLI)
    folder = in_tmp_path / "runs" / "sweeps" / "folds"
    for trial in sorted(folder.glob("trial_*")):
        train(["test", *fast_args, "--ckpt_path", str(next((trial / "checkpoints").glob("best-*.ckpt")))])
    capsys.readouterr()
    rows = table(capsys, "runs")
    assert sorted(row["data.fold"] for row in rows) == ["0", "1"]
    runs(["runs"])
    out = capsys.readouterr().out
    assert "cross-validation over 2 folds" in out and "  folds complete: 2 of 2\n" in out, out
    values = [float(row["val/acc"]) for row in rows]
    tests = [float(row["test/acc"]) for row in rows]
    assert f"  val/acc (monitored): mean {sum(values) / 2:.4f}, standard deviation " in out, out
    assert f"  test/acc: mean {sum(tests) / 2:.4f}, standard deviation " in out, out
    assert "importance" not in out


def logged(folder: Path, metrics: dict[str, list[float]], record: dict | None = None) -> Path:
    """A run folder as fit writes it, of any model: config.yaml, metrics.csv with ``metrics``' values (one row an
    epoch, at its last step) and run.json (finished, without a monitor unless ``record`` names one)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"lr": 0.01}}))
    columns = list(metrics)
    epochs = len(next(iter(metrics.values())))
    rows = "".join(
        ",".join([str(epoch), str(10 * epoch + 9), *(str(metrics[column][epoch]) for column in columns)]) + "\n"
        for epoch in range(epochs)
    )
    (folder / "metrics.csv").write_text(",".join(["epoch", "step", *columns]) + "\n" + rows)
    started = "2026-01-01T10:00:00+00:00"
    (folder / RUN_FILE).write_text(json.dumps({"status": "finished", "started": started, **(record or {})}))
    return folder


def test_the_best_epoch_is_the_monitored_metrics_and_a_run_without_one_shows_its_last(tmp_path, capsys):
    """The best epoch is found by the monitor and mode run.json records (val/mae, min), however the metrics
    are named; a run that monitors nothing shows its last validated epoch, called so (``2 (last)`` and a
    note), with its latest checkpoint; so does a run whose monitor was never logged. Metrics named with ``_``
    are columns as those with ``/``, test metrics too."""
    regression = {"train/loss": [0.9, 0.5, 0.4], "val/loss": [0.5, 0.3, 0.4], "val/mae": [0.4, 0.2, 0.3]}
    logged(tmp_path / "min", regression, {"monitor": "val/mae", "mode": "min"})
    logged(tmp_path / "none", {"val_loss": [0.5, 0.3, 0.4], "val_r2": [0.1, 0.5, 0.4]})
    (tmp_path / "none" / "checkpoints").mkdir()
    (tmp_path / "none" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (tmp_path / "none" / "test" / "version_0").mkdir(parents=True)
    (tmp_path / "none" / "test" / "version_0" / "metrics.csv").write_text("epoch,step,test_r2\n0,0,0.45\n")
    logged(tmp_path / "null", {"val/acc": [0.9, 0.5]}, {"monitor": None})
    logged(tmp_path / "unlogged", {"val/mae": [0.4, 0.2]}, {"monitor": "val/rmse", "mode": "min"})
    rows = {row["run"]: row for row in table(capsys, str(tmp_path))}
    assert (rows["min"]["best_epoch"], rows["min"]["val/mae"], rows["min"]["val/loss"]) == ("1", "0.2", "0.3")
    assert rows["min"]["note"] == "" and "train/loss" not in rows["min"]
    assert (rows["none"]["best_epoch"], rows["none"]["val_r2"], rows["none"]["test_r2"]) == ("2", "0.4", "0.45")
    assert rows["none"]["note"] == "no monitored metric: the last validated epoch's metrics"
    assert rows["none"]["checkpoint"] == str(tmp_path / "none" / "checkpoints" / "last.ckpt")
    assert (rows["null"]["best_epoch"], rows["null"]["val/acc"]) == ("1", "0.5")
    assert (rows["unlogged"]["best_epoch"], rows["unlogged"]["val/mae"]) == ("1", "0.2")
    assert rows["unlogged"]["note"] == "val/rmse (monitored) not logged: the last validated epoch's metrics"
    runs([str(tmp_path)])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " 2 (last) " in lines["none"] and {"0.4000", "0.4500"} <= set(lines["none"].split())
    assert "(last)" not in lines["min"] and "0.2000" in lines["min"].split()


def test_durations_under_a_minute_keep_a_tenth_of_a_second(tmp_path, capsys):
    """0.4 s is ``0.4s``, not ``0s``; minutes and hours as before; the CSV keeps the seconds as recorded."""
    from lightning_kit.runs.table import duration_text

    assert [duration_text(s) for s in (0.4, 0.04, 16.3, 59.94, 59.96, 192, 3725)] == [
        "0.4s",
        "0.0s",
        "16.3s",
        "59.9s",
        "1m00s",
        "3m12s",
        "1h02m",
    ]
    hand_made(tmp_path / "quick", record={"duration_s": 0.4})
    assert table(capsys, str(tmp_path))[0]["duration"] == "0.4"
    runs([str(tmp_path)])
    assert capsys.readouterr().out.splitlines()[1].split()[-1] == "0.4s"
