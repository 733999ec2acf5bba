"""Sweeps and cross-validation (``lightning_kit.sweep``), run as the image project runs them: its ``ProjectCLI``
in this process, ``python -m image_project.sweep`` in processes of their own; and once through ``GenericCLI``
(``python -m lightning_kit.sweep --model ... --data ...``), as a project without a command line of its own."""

import csv
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import CONFIGS, HANG_GUARD_S, exit_message, wait_until_written
from image_project.cli import ProjectCLI
from optuna.trial import TrialState

from lightning_kit.cli import GenericCLI
from lightning_kit.sweep.command import main as sweep_main

SWEEPS = Path("runs/sweeps")
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)
# Two learning rates that learn the synthetic images in a few steps, and one that cannot learn at all.
LEARNING_RATES = "[0.001, 0.002, 1.0e-9]"
LEARNING = ["--trainer.limit_train_batches", "3"]
# The image project's classes, named on the command line as GenericCLI takes them (the data sets no sizes there).
GENERIC = [
    *("--model", "image_project.classifier.Classifier", "--model.num_classes", "10"),
    *("--model.net", "image_project.models.cnn.ReferenceCNN"),
    *("--data", "image_project.data.images.ImageDataModule", "--data.dataset", "synthetic"),
]


def main(args: list[str]) -> None:
    """``python -m image_project.sweep args``, in this process."""
    sweep_main(args, cli_class=ProjectCLI)


@pytest.fixture(scope="module")
def sweep_args(fast_args) -> list[str]:
    """train.py's flags for short trials: a few batches, two epochs, nothing printed that a test does not read."""
    return [*fast_args, "--max_epochs", "2", "--trainer.enable_model_summary", "false"]


def study(folder: Path, name: str) -> optuna.Study:
    """The study ``name`` of the sweep run in ``folder``, from its SQLite file."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / SWEEPS / name / 'study.db'}")


def epochs_validated(run_folder: Path) -> list[int]:
    """The epochs a run's metrics.csv holds a validation result for, in order."""
    with (run_folder / "metrics.csv").open() as file:
        return [int(row["epoch"]) for row in csv.DictReader(file) if row.get("val/acc")]


def start_sweep(folder: Path, *args: str, module: str = "image_project.sweep") -> subprocess.Popen:
    """``python -m image_project.sweep args`` (or another ``module``) in its own process in ``folder``, with Ctrl-C's
    default handling."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=folder,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the baked projects are on its PYTHONPATH (conftest)
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finished(process: subprocess.Popen) -> str:
    """The output of ``process``, once it has ended with status 0; fails otherwise."""
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 0, output
    return output


# Every combination once, in the file's order: the hopeless learning rate last, pruned once two trials have finished.
GRID = ["--space", "lr.yaml", "--sampler", "grid", "--prune_after", "2"]


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory, sweep_args) -> Path:
    """A folder holding a grid sweep over two useful learning rates and a hopeless one, in that order."""
    folder = tmp_path_factory.mktemp("grid")
    (folder / "lr.yaml").write_text(f"model.lr: {LEARNING_RATES}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main([*GRID, *sweep_args, "--max_epochs", "3", *LEARNING])
    return folder


@pytest.mark.slow
def test_a_sweep_finds_a_better_learning_rate_than_a_hopeless_one(grid_sweep):
    """The best trial's learning rate is a useful one, and it scores better than the hopeless one."""
    trials = study(grid_sweep, "lr").trials
    hopeless = next(trial for trial in trials if trial.params["model.lr"] == 1e-9)
    best = study(grid_sweep, "lr").best_trial
    assert best.params["model.lr"] != 1e-9
    assert best.value > max(hopeless.intermediate_values.values())
    folder = grid_sweep / best.user_attrs["run_folder"]
    assert (folder / "config.yaml").is_file() and (folder / "checkpoints" / "last.ckpt").is_file()
    assert f"--model.lr {best.params['model.lr']}" in best.user_attrs["command"]


@pytest.mark.slow
def test_pruning_stops_a_hopeless_trial_early(grid_sweep):
    """Once two trials have finished, the hopeless one is pruned after its second epoch of three, its run whole."""
    trials = study(grid_sweep, "lr").trials
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    folder = grid_sweep / trials[2].user_attrs["run_folder"]
    assert epochs_validated(folder) == [0, 1]
    assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file()


@pytest.mark.slow
def test_a_trial_stopped_by_sigterm_then_killed_resumes_from_its_checkpoint_each_time(in_tmp_path, sweep_args):
    """SIGTERM mid-trial: one line saying to run the same command, which resumes the trial from its checkpoint;
    kill -9 that run after an epoch, run again: it resumes from there. No epoch is trained twice; 1 trial complete."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: {low: 1.0e-3, high: 1.0e-2, log: true}\n")
    args = ["--space", "lr.yaml", "--trials", "1", "--pruner", "none", *sweep_args, "--max_epochs", "3"]
    folders = [SWEEPS / "lr" / f"trial_{number:04d}" for number in range(3)]
    process = start_sweep(in_tmp_path, *args)
    wait_until_written(folders[0] / "checkpoints" / "last.ckpt", process)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    saved = folders[0] / "checkpoints" / "on_exception.ckpt"
    assert process.returncode == 1, output
    assert output.strip().splitlines()[-1] == (
        f"stopped by Ctrl-C or SIGTERM in trial 0 ({saved} saved): to continue the sweep, run the same command "
        f"again: python -m image_project.sweep {' '.join(args)}"
    )

    process = start_sweep(in_tmp_path, *args)
    killed_at = folders[1] / "checkpoints" / "last.ckpt"
    wait_until_written(killed_at, process)
    process.kill()
    process.communicate()
    assert study(in_tmp_path, "lr").trials[1].state == TrialState.RUNNING, "killed after its trial had ended"

    main(args)
    trials = study(in_tmp_path, "lr").trials
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    assert [trial.user_attrs.get("retry_of") for trial in trials] == [None, 0, 1]
    assert [trial.user_attrs.get("resumed_from") for trial in trials] == [None, str(saved), str(killed_at)]
    assert all(trial.params == trials[0].params for trial in trials)
    resumed = epochs_validated(folders[2])
    assert resumed == [2], f"trained again, or not to the end: epochs {resumed} after the kill"
    assert sorted((SWEEPS / "lr").glob("trial_*")) == folders


@pytest.mark.slow
def test_two_workers_share_a_study_without_running_a_trial_twice(in_tmp_path, sweep_args):
    """Two sweep processes started at once on one study of the shipped example space run its 2 trials between them,
    each once."""
    args = ["--space", str(CONFIGS / "sweeps" / "example.yaml"), "--trials", "2", *sweep_args, "--max_epochs", "1"]
    workers = [start_sweep(in_tmp_path, *args) for _ in range(2)]
    for worker in workers:
        finished(worker)
    trials = study(in_tmp_path, "example").trials
    assert sum(trial.state in COUNTED for trial in trials) == 2
    started = [trial.number for trial in trials if "run_folder" in trial.user_attrs]
    assert len(started) == 2
    assert sorted(path.name for path in (SWEEPS / "example").glob("trial_*")) == [f"trial_{n:04d}" for n in started]


@pytest.mark.slow
def test_workers_share_a_study_in_postgresql(postgres_url, tmp_path, sweep_args):
    """Two workers, each in its own folder as on its own machine, run a study's 2 trials in PostgreSQL between them."""
    args = ["--space", "lr.yaml", "--trials", "2", "--storage", postgres_url, "--study", "shared"]
    args += [*sweep_args, "--max_epochs", "1"]
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        folder.mkdir()
        (folder / "lr.yaml").write_text("model.lr: {low: 1.0e-3, high: 1.0e-2, log: true}\n")
    workers = [start_sweep(folder, *args) for folder in folders]
    for worker in workers:
        finished(worker)
    trials = optuna.load_study(study_name="shared", storage=postgres_url).trials
    assert sum(trial.state in COUNTED for trial in trials) == 2
    ran = sorted(path.name for folder in folders for path in (folder / SWEEPS / "shared").glob("trial_*"))
    assert ran == [f"trial_{trial.number:04d}" for trial in trials if "run_folder" in trial.user_attrs]


@pytest.mark.slow
def test_cross_validation_runs_each_fold_once_and_reports_their_spread(in_tmp_path, sweep_args, capsys):
    """--folds 2 trains on folds 0 and 1 (each once, by --data.fold), then prints the metric's mean and spread."""
    main(["--folds", "2", *sweep_args, "--max_epochs", "1"])
    trials = study(in_tmp_path, "folds").trials
    assert sorted(trial.params["data.fold"] for trial in trials) == [0, 1]
    assert all(trial.state == TrialState.COMPLETE for trial in trials)
    config = (in_tmp_path / trials[1].user_attrs["run_folder"] / "config.yaml").read_text()
    assert "folds: 2" in config and f"fold: {trials[1].params['data.fold']}" in config
    said = capsys.readouterr().out
    assert "val/acc over 2 folds: mean " in said
    # The same line on the study, which Optuna's dashboard shows, and the metric by its name there.
    recorded = study(in_tmp_path, "folds")
    assert recorded.user_attrs["cross_validation"] in said and recorded.metric_names == ["val/acc"]


@pytest.mark.parametrize(
    ("space", "named"),
    [
        ("model.lr: [0.1\n", "space.yaml is not YAML"),
        ("- model.lr\n", "space.yaml must map fit's flags"),
        (
            "model.lrr: [0.1, 0.01]\n",
            "space.yaml: model.lrr is not an argument of python train.py: did you mean model.lr?",
        ),
        (
            "model.lr: {low: 0.1, high: 0.01}\n",
            "space.yaml: model.lr: `low <= high` must hold, but got (low=0.1, high=0.01)",
        ),
        ("model.lr: {low: 0.0, high: 0.1, log: true}\n", "space.yaml: model.lr: "),
        ("model.lr: {low: 0.1}\n", "space.yaml: model.lr: {'low': 0.1} is not a range"),
        ("model.lr: []\n", "space.yaml: model.lr: the list of choices is empty"),
        ("data.batch_size: [32, 0]\n", "space.yaml: data.batch_size: 0 is refused: --data.batch_size"),
    ],
)
def test_a_bad_space_file_ends_in_one_line_naming_it(in_tmp_path, sweep_args, space, named):
    """Each kind of mistake in the space file stops the sweep before it starts, in one line naming the file and key."""
    (in_tmp_path / "space.yaml").write_text(space)
    message = exit_message(main, "--space", "space.yaml", "--trials", "2", *sweep_args)
    assert message.startswith(f"error: {named}") and "\n" not in message, message
    assert not (in_tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--trials", "0"], "argument --trials: invalid int from 1 to 1000000 value: '0'"),
        (["--trials", "2", "--sampler", "bayes"], "argument --sampler: invalid choice: 'bayes'"),
        (["--trials", "2", "--storage", "not a url"], "--storage 'not a url' is not a database URL"),
        (["--trials", "2", "--storage", "me:s3cret@host"], "--storage 'me:***@host' is not a database URL"),
        (["--trials", "2", "--storage", "mysql+nosuchdriver://me@127.0.0.1/db"], "--storage mysql+nosuchdriver"),
        (["--trials", "2", "--storage", "postgresql+psycopg://me@127.0.0.1:9/db"], "--storage postgresql+psycopg"),
    ],
)
def test_a_bad_sweep_option_ends_in_one_line_naming_it(in_tmp_path, sweep_args, args, named, capsys):
    """A trial count, sampler or store the sweep cannot use stops it in one line naming the option."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.1, 0.01]\n")
    code = exit_message(main, "--space", "lr.yaml", *args, *sweep_args)
    message = capsys.readouterr().err if code == "2" else code
    assert message.startswith(f"error: {named}") and "\n" not in message.strip(), message


@pytest.mark.slow
def test_a_sweep_through_the_generic_command_line(in_tmp_path):
    """``python -m lightning_kit.sweep`` builds any project's classes by class path (GenericCLI), and judges its
    trials by the metric of the ModelCheckpoint it is given: a grid of two learning rates, each trained once."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.001, 0.002]\n")
    judge = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/acc"]
    args = ["--space", "lr.yaml", "--sampler", "grid", *GENERIC, "--accelerator", "cpu", "--max_epochs", "1"]
    args += [*judge, "--trainer.callbacks.mode", "max", "--trainer.enable_progress_bar", "false"]
    args += ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2"]
    output = finished(start_sweep(in_tmp_path, *args, module="lightning_kit.sweep"))
    assert "study lr: 2 trials, judged by val/acc (maximize)" in output, output
    trials = study(in_tmp_path, "lr").trials
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert sorted(trial.params["model.lr"] for trial in trials) == [0.001, 0.002]
    for trial in trials:
        folder = in_tmp_path / trial.user_attrs["run_folder"]
        assert epochs_validated(folder) == [0]
        assert "class_path: image_project.classifier.Classifier" in (folder / "config.yaml").read_text()
        assert (folder / "checkpoints" / "last.ckpt").is_file()


def test_a_generic_sweep_without_a_monitored_metric_says_how_to_give_one(in_tmp_path):
    """GenericCLI chooses no best checkpoint by a metric (the module's metrics are its own): a sweep through it
    without one stops in one line that says how to give it, before any trial."""
    (in_tmp_path / "lr.yaml").write_text("model.lr: [0.1, 0.01]\n")
    generic = functools.partial(sweep_main, cli_class=GenericCLI)
    message = exit_message(generic, "--space", "lr.yaml", "--trials", "1", *GENERIC, "--accelerator", "cpu")
    assert message.startswith("error: a sweep judges trials by the checkpoint callback's monitored metric"), message
    assert "--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.monitor <metric>" in message
    assert "\n" not in message and not (in_tmp_path / "runs").exists()
