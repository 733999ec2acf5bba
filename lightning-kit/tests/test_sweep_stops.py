"""A sweep's trial ends in exactly one way, and a grid's points and the folds each run once, whatever stops in between.

The queue (``lightning_kit.sweep.queue``) is tested first on a real SQLite store with trials that end as told
(completed, stopped by a signal, left running by a killed process, stopped between failing and queueing again,
failed by their own code), in this process and in processes of their own that are killed; then whole sweeps of
the image project: a grid stopped by SIGTERM, a double Ctrl-C and kill -9 and run again, a disk full while
writing a checkpoint, and cross-validation re-run after images were added to its folder.
"""

import contextlib
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from conftest import CONFIGS, HANG_GUARD_S, exit_message, solid, wait_until_written
from image_project.cli import ProjectCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from lightning_kit.sweep.command import main as sweep_main
from lightning_kit.sweep.queue import (
    DUPLICATE_OF,
    ERROR,
    OWNER,
    RETRY_OF,
    STOPPED,
    queue_retry,
    run_trials,
    stop_and_retry,
)
from lightning_kit.sweep.store import open_storage
from lightning_kit.sweep.trial import DISK_FULL, SIGNAL, STORE_LOST, InterruptionError, stop_of_the_process

SWEEPS = Path("runs/sweeps")
GRID = [{"x": x, "y": y} for x in (1, 2, 3) for y in ("a", "b")]


def main(args: list[str]) -> None:
    """``python -m image_project.sweep args``, in this process."""
    sweep_main(args, cli_class=ProjectCLI)


# ---------------------------------------------------------------- how a trial ended: a stop, or its own code


def _raised_while_handling(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904  (as Lightning and torch do: the first error is its context)
    except BaseException as err:
        return err


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (KeyboardInterrupt(), SIGNAL),
        (SIGTERMException(), SIGNAL),
        # Lightning: Ctrl-C, or SIGTERM before training started, becomes sys.exit(1) while handling it.
        (_raised_while_handling(SystemExit(1), KeyboardInterrupt()), SIGNAL),
        # torch.save past a full disk or `ulimit -f`: a RuntimeError while handling the OSError.
        (_raised_while_handling(RuntimeError("unexpected pos"), OSError(errno.EFBIG, "File too large")), DISK_FULL),
        (OSError(errno.ENOSPC, "No space left on device", "last.ckpt"), DISK_FULL),
        (_raised_while_handling(RuntimeError("x"), OperationalError("SELECT", {}, Exception("gone"))), STORE_LOST),
        (optuna.exceptions.StorageInternalError("lost"), STORE_LOST),
        (ValueError("a bug in the model"), None),
        (SystemExit("error: --model.lr: must be positive"), None),
        (OSError(errno.ENOENT, "No such file"), None),
        (RuntimeError("CUDA out of memory"), None),
    ],
)
def test_a_stop_of_the_process_is_told_from_a_failure_of_the_trials_own_code(err, reason):
    """Signals (however Lightning wraps them), a full disk and a lost store are stops, run again; the rest, own code."""
    found = stop_of_the_process(err)
    assert (found[0] if found else None) == reason


# ---------------------------------------------------------------- the queue, with trials that end as told


def _store(folder: Path, grid=GRID):
    url = f"sqlite:///{folder / 'study.db'}"
    storage = open_storage(url, on_stale=queue_retry)
    try:
        study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name="s", storage=storage)
    else:
        for params in grid or ():
            study.enqueue_trial(params)
    return study, storage


class Ends:
    """A trial's stand-in for training: it completes, unless ``plan`` says otherwise for the n-th trial it is given."""

    def __init__(self, study, plan: dict[int, str]) -> None:
        self.study, self.plan, self.given, self.trained = study, plan, 0, []

    def __call__(self, trial) -> None:
        x, y = trial.suggest_categorical("x", [1, 2, 3]), trial.suggest_categorical("y", ["a", "b"])
        ending, self.given = self.plan.get(self.given), self.given + 1
        if ending == "sigterm":  # what run_trial does for a stop: recorded, failed, queued again
            stop_and_retry(self.study, trial, SIGNAL)
            raise InterruptionError(trial.number, None, SIGNAL)
        if ending == "kill -9":  # the process gone without a word: its trial left running, owned by a dead process
            gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
            trial.set_user_attr(OWNER, {"host": os.uname().nodename, "pid": int(gone.stdout), "process": None})
            raise InterruptionError(trial.number, None, SIGNAL)
        if ending == "killed while failing it":  # failed in the store, then killed before its retry was queued
            trial.set_user_attr(STOPPED, SIGNAL)
            self.study.tell(trial, state=TrialState.FAIL)
            raise InterruptionError(trial.number, None, SIGNAL)
        if ending == "bug":
            trial.set_user_attr(ERROR, "ValueError: a bug")
            self.study.tell(trial, state=TrialState.FAIL)
            return
        self.trained.append((x, y))
        self.study.tell(trial, float(x))


def _runs(study) -> dict[str, list[TrialState]]:
    """Each grid point's trials' states, duplicates left out."""
    found: dict[str, list[TrialState]] = {}
    for trial in study.get_trials():
        if DUPLICATE_OF not in trial.user_attrs and trial.params:
            found.setdefault(json.dumps([trial.params["x"], trial.params["y"]]), []).append(trial.state)
    return found


def test_a_grid_runs_each_point_once_through_any_sequence_of_stops(tmp_path):
    """A SIGTERM, a kill -9, a kill between failing a trial and queueing it again, each followed by a new run:
    at the end each of the 6 points is complete exactly once, and nothing was trained to its end twice."""
    study, storage = _store(tmp_path)
    trained = []
    for plan in ({1: "sigterm"}, {0: "kill -9"}, {1: "killed while failing it"}, {}):
        ends = Ends(study, plan)
        with contextlib.suppress(InterruptionError):
            run_trials(study, storage, len(GRID), ends, GRID)
        trained += ends.trained
    runs = _runs(study)
    assert sorted(runs) == sorted(json.dumps([p["x"], p["y"]]) for p in GRID)
    assert all(states.count(TrialState.COMPLETE) == 1 for states in runs.values()), runs
    assert sorted(trained) == sorted((p["x"], p["y"]) for p in GRID)
    stopped = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(stopped) == 3 and all(any(r.user_attrs.get(RETRY_OF) == t.number for r in study.trials) for t in stopped)


def test_a_point_queued_twice_is_trained_once_and_the_other_recorded_as_its_duplicate(tmp_path):
    """Two workers mending the queue at once may queue one point twice: one trial trains it, the other never runs."""
    study, storage = _store(tmp_path)
    study.enqueue_trial(GRID[0])
    ends = Ends(study, {})
    run_trials(study, storage, len(GRID), ends, GRID)
    assert sorted(ends.trained) == sorted((p["x"], p["y"]) for p in GRID)
    duplicates = [t for t in study.get_trials() if DUPLICATE_OF in t.user_attrs]
    assert (
        len(duplicates) == 1 and duplicates[0].state == TrialState.FAIL and "run_folder" not in duplicates[0].user_attrs
    )


def test_a_point_failed_by_its_own_code_is_not_run_again_until_the_sweep_is(tmp_path):
    """A trial failed by its own code ends its point for this run (no retry); the next run of the sweep tries it."""
    study, storage = _store(tmp_path)
    first = Ends(study, {2: "bug"})
    run_trials(study, storage, len(GRID), first, GRID)
    assert len(first.trained) == 5
    assert [t.state for t in study.get_trials()].count(TrialState.FAIL) == 1
    again = Ends(study, {})
    run_trials(study, storage, len(GRID), again, GRID)
    assert len(again.trained) == 1
    assert all(states.count(TrialState.COMPLETE) == 1 for states in _runs(study).values())


WORKER = textwrap.dedent(
    """
    import sys, time, warnings
    warnings.simplefilter("ignore")
    import optuna
    from optuna.trial import TrialState
    from lightning_kit.sweep.queue import queue_retry, run_trials
    from lightning_kit.sweep.store import open_storage
    grid = [{"x": x, "y": y} for x in (1, 2, 3) for y in ("a", "b")]
    storage = open_storage(sys.argv[1], on_stale=queue_retry)
    study = optuna.load_study(study_name="s", storage=storage)

    def train(trial):
        x, y = trial.suggest_categorical("x", [1, 2, 3]), trial.suggest_categorical("y", ["a", "b"])
        print(f"start {trial.number} {x}{y}", flush=True)
        time.sleep(0.4)
        with open(sys.argv[2], "a") as log:
            log.write(f"{x}{y}\\n")
        study.tell(trial, float(x))

    run_trials(study, storage, len(grid), train, grid)
    """
)


@pytest.mark.slow
def test_two_workers_killed_and_run_again_run_each_point_once(tmp_path):
    """Two worker processes on one store; one is killed (-9) in a trial, then both are run again: each point is
    trained to its end once (a log line per point) and complete once."""
    study, _ = _store(tmp_path)
    log = tmp_path / "trained.log"
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def worker() -> subprocess.Popen:
        command = [sys.executable, "-c", WORKER, url, str(log)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first, second = worker(), worker()
    while not (line := first.stdout.readline()).startswith("start"):  # in a trial
        assert line, first.communicate()[0]
    first.kill()
    first.communicate(timeout=HANG_GUARD_S)
    for process in (second, worker(), worker()):
        output = process.communicate(timeout=HANG_GUARD_S)[0]
        assert process.returncode == 0, output
    assert sorted(log.read_text().split()) == sorted(f"{p['x']}{p['y']}" for p in GRID)
    assert all(states.count(TrialState.COMPLETE) == 1 for states in _runs(study).values())
    assert len(_runs(study)) == len(GRID)


# ---------------------------------------------------------------- whole sweeps of the image project


def start_sweep(folder: Path, *args: str, limit_file_bytes: int | None = None) -> subprocess.Popen:
    """``python -m image_project.sweep args`` in its own process in ``folder`` (Ctrl-C's default handling; files
    limited to ``limit_file_bytes``, as by ``ulimit -f``, when given)."""

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if limit_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    return subprocess.Popen(
        [sys.executable, "-m", "image_project.sweep", *args],
        cwd=folder,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=prepare,
    )


def study(folder: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / SWEEPS / name / 'study.db'}")


@pytest.fixture(scope="module")
def sweep_args(fast_args) -> list[str]:
    return [*fast_args, "--max_epochs", "2", "--trainer.enable_model_summary", "false"]


@pytest.mark.slow
def test_a_grid_stopped_by_sigterm_a_double_ctrl_c_and_kill_9_runs_each_point_once(in_tmp_path, sweep_args):
    """A grid of 3 learning rates: SIGTERM in its first trial, Ctrl-C twice (Lightning's SystemExit(1)) in the
    next run's, kill -9 in the next; run again: each learning rate complete once, each retry resumed from the
    checkpoint its predecessor saved, and nothing skipped (exit 0)."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.002, 0.003]\n")
    args = ["--space", "lr.yaml", "--sampler", "grid", "--pruner", "none", *sweep_args]
    for stop in ("sigterm", "ctrl-c twice", "kill -9"):
        process = start_sweep(in_tmp_path, *args)
        before = {path.name for path in (in_tmp_path / SWEEPS / "lr").glob("trial_*")}
        folder = next(iter(sorted(set(_trial_folders(in_tmp_path, process, before)))))
        wait_until_written(in_tmp_path / SWEEPS / "lr" / folder / "checkpoints" / "last.ckpt", process)
        if stop == "sigterm":
            process.send_signal(signal.SIGTERM)
        elif stop == "ctrl-c twice":
            process.send_signal(signal.SIGINT)
            process.send_signal(signal.SIGINT)
        else:
            process.kill()
        output = process.communicate(timeout=HANG_GUARD_S)[0]
        assert process.returncode != 0, output
        if stop != "kill -9":
            assert "to continue the sweep, run the same command again" in output.strip().splitlines()[-1], output
    main(args)
    trials = study(in_tmp_path, "lr").trials
    complete = sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE)
    assert complete == [0.001, 0.002, 0.003], [(t.number, t.state, t.params, t.user_attrs) for t in trials]
    retries = [t for t in trials if t.user_attrs.get(RETRY_OF) is not None]
    assert len(retries) == 3 and all(t.params == trials[t.user_attrs[RETRY_OF]].params for t in retries)
    assert all(t.user_attrs.get("resumed_from") for t in retries), [t.user_attrs for t in retries]
    # Judged by every epoch it trained, before and after each stop: not by the epochs after its last resume alone.
    assert all(t.value == max(t.intermediate_values.values()) for t in trials if t.state == TrialState.COMPLETE)


@pytest.mark.slow
def test_two_workers_on_a_grid_one_killed_the_other_runs_its_trial_again(in_tmp_path, sweep_args):
    """Two sweep processes on a grid of 3; one is killed (-9) in its trial: the other, finding its process gone,
    runs that trial again, and every learning rate is complete once, without a re-run."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.002, 0.003]\n")
    args = ["--space", "lr.yaml", "--sampler", "grid", "--pruner", "none", *sweep_args, "--max_epochs", "1"]
    first = start_sweep(in_tmp_path, *args)
    wait_until_written(in_tmp_path / SWEEPS / "lr" / "trial_0000" / "run.json", first)
    second = start_sweep(in_tmp_path, *args)
    first.kill()
    first.communicate()
    output = second.communicate(timeout=HANG_GUARD_S)[0]
    assert second.returncode == 0, output
    trials = study(in_tmp_path, "lr").trials
    complete = sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE)
    assert complete == [0.001, 0.002, 0.003], [(t.number, t.state, t.params, t.user_attrs) for t in trials]
    assert [t.user_attrs.get(RETRY_OF) for t in trials if t.state == TrialState.FAIL] == [None]


def _trial_folders(folder: Path, process: subprocess.Popen, before: set[str]):
    """The trial folders the running sweep makes, as they appear."""
    import time

    while True:
        made = {path.name for path in (folder / SWEEPS / "lr").glob("trial_*")} - before
        if made:
            yield from sorted(made)
            return
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.05)


@pytest.mark.slow
def test_a_disk_full_while_writing_a_checkpoint_stops_the_sweep_and_the_trial_runs_again(in_tmp_path, sweep_args):
    """Past `ulimit -f` (EFBIG, as a full disk's ENOSPC) a checkpoint cannot be written: one line says the disk is
    full and to run again; the trial is stopped, not failed, and the next run completes it with its parameters."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.002]\n")
    args = ["--space", "lr.yaml", "--sampler", "grid", "--pruner", "none", *sweep_args, "--max_epochs", "1"]
    process = start_sweep(in_tmp_path, *args, limit_file_bytes=200_000)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: stopped in trial 0: the disk is full (File too large"), output
    assert "free some space, then run the same command again: python -m image_project.sweep" in last
    first = study(in_tmp_path, "lr").trials[0]
    assert first.state == TrialState.FAIL and first.user_attrs[STOPPED].startswith(DISK_FULL), first.user_attrs
    assert ERROR not in first.user_attrs
    main(args)
    trials = study(in_tmp_path, "lr").trials
    assert sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE) == [0.001, 0.002]


def _images(root: Path, per_class: int) -> None:
    for name, colour in (("red", (220, 30, 30)), ("blue", (30, 30, 220))):
        for k in range(per_class):
            solid(root / name / f"{k:02d}.png", colour=tuple(max(0, c - 3 * k) for c in colour), size=(8, 8))


@pytest.mark.slow
def test_cross_validation_rerun_on_a_folder_with_added_images_is_refused_or_a_new_study(in_tmp_path, capsys):
    """Folds over a folder of images, then images added: the re-run is refused in one line naming the data (no
    fold of the other data is trained), and --new_study runs a study of its own beside it."""
    _images(in_tmp_path / "images", 4)
    args = ["--folds", "2", "--config", str(CONFIGS / "image_folder.yaml"), "--data.root", "images"]
    args += ["--data.image_size", "8", "--data.batch_size", "4", "--accelerator", "cpu", "--max_epochs", "1"]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    main(args)
    assert [t.state for t in study(in_tmp_path, "folds").trials] == [TrialState.COMPLETE] * 2
    solid(in_tmp_path / "images" / "red" / "added.png", colour=(200, 0, 0), size=(8, 8))
    message = exit_message(main, *args)
    assert message.startswith("error: study folds in ") and "was started with other data (then: 7 training" in message
    assert "--new_study" in message and "\n" not in message, message
    assert len(study(in_tmp_path, "folds").trials) == 2
    capsys.readouterr()
    main([*args, "--new_study"])
    assert "study folds-2: 2 trials" in capsys.readouterr().out
    assert [t.state for t in study(in_tmp_path, "folds-2").trials] == [TrialState.COMPLETE] * 2
    main([*args, "--new_study"])  # run again: the new study, complete, is the one it continues
    assert len(study(in_tmp_path, "folds-2").trials) == 2 and not (in_tmp_path / SWEEPS / "folds-3").exists()


@pytest.mark.slow
def test_a_space_file_changed_since_the_study_began_is_refused_naming_the_key(in_tmp_path, sweep_args):
    """A grid run once, then its space file edited: the re-run is refused in one line naming the key."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")
    args = ["--space", "lr.yaml", "--sampler", "grid", *sweep_args, "--max_epochs", "1"]
    main(args)
    (in_tmp_path / "lr.yaml").write_text("# the same\nmodel.lr: [0.001]\n")
    main(args)  # a comment changes no trial
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.01]\n")
    message = exit_message(main, *args)
    assert "was started with another search space (model.lr: then CategoricalDistribution" in message, message
    assert "\n" not in message
    recorded = study(in_tmp_path, "lr").user_attrs["sweep"]
    assert recorded["space_file"] == "model.lr: [0.001]\n" and recorded["data"]["digest"]


@pytest.mark.parametrize(
    ("space", "args", "named"),
    [
        (
            "model.lr: [0.1]\nmodel.lr: [0.2]\n",
            ["--trials", "2"],
            "space.yaml: model.lr is given twice (lines 1 and 2)",
        ),
        ("model.lr: {low: 0.1, low: 0.2, high: 1.0}\n", ["--trials", "2"], "space.yaml: low is given twice"),
        (
            "model.lr: [0.1, 0.01]\ndata.batch_size: [8, 16]\n",
            ["--sampler", "grid", "--trials", "3"],
            "--trials is not used with --sampler grid, which runs each of its 4 combinations once",
        ),
    ],
)
def test_a_repeated_key_or_trials_with_a_grid_is_answered_in_one_line(in_tmp_path, fast_args, space, args, named):
    """A space file naming a key twice is refused (not the last one kept); --trials with a grid is told why."""
    (in_tmp_path / "space.yaml").write_text(space)
    message = exit_message(main, "--space", "space.yaml", *args, *fast_args)
    assert message.startswith(f"error: {named}") and "\n" not in message, message
    assert not (in_tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_store_lost_during_a_trial_stops_the_sweep_and_the_trial_runs_again(in_tmp_path, sweep_args):
    """The study's database unreadable in the middle of a trial (its bytes overwritten): one line says the store
    was lost and to run again; once it is back, the next run finds the trial left running, and completes it."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001]\n")
    args = ["--space", "lr.yaml", "--sampler", "grid", "--pruner", "none", *sweep_args, "--max_epochs", "4"]
    process = start_sweep(in_tmp_path, *args)
    wait_until_written(in_tmp_path / SWEEPS / "lr" / "trial_0000" / "checkpoints" / "last.ckpt", process)
    database = in_tmp_path / SWEEPS / "lr" / "study.db"
    whole = database.read_bytes()
    with database.open("r+b") as file:  # in place: the sweep's open connection reads it
        file.write(b"\0" * len(whole))
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: stopped in trial 0: the store was lost ("), output
    assert "once the store can be reached, run the same command again: python -m image_project.sweep" in last
    database.write_bytes(whole)
    main(args)
    trials = study(in_tmp_path, "lr").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs[RETRY_OF] == 0 and trials[1].params == trials[0].params
