"""Evaluation from a checkpoint knows what it evaluates: the checkpoint given, the whole split unless told
otherwise, and a folder of its own."""

import csv
import hashlib
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import LAST, RUN, RUNS, epoch_metrics, exit_message
from image_project.cli import main


def _newest_evaluation(subcommand: str) -> dict[str, str]:
    folders = sorted((RUN / subcommand).iterdir(), key=lambda folder: int(folder.name.split("_")[1]))
    with (folders[-1] / "metrics.csv").open() as file:
        return next(csv.DictReader(file))


def _trained_val_loss() -> float:
    with (RUN / "metrics.csv").open() as file:
        return [float(row["val/loss"]) for row in csv.DictReader(file) if row.get("val/loss")][-1]


@pytest.mark.slow
def test_validate_loads_the_given_checkpoint_whatever_the_order_of_config(run_copy):
    """`validate --ckpt_path X --config run/config.yaml` loads X in either order: the run's `ckpt_path: null`
    does not replace it, and the run's own two validation batches give the training's number."""
    config, limit = ["--config", str(RUN / "config.yaml")], ["--trainer.limit_val_batches", "2"]
    for args in ([*config, "--ckpt_path", str(LAST)], ["--ckpt_path", str(LAST), *config]):
        main(["validate", "--accelerator", "cpu", *args, *limit])
        assert float(_newest_evaluation("validate")["val/loss"]) == pytest.approx(_trained_val_loss(), abs=1e-5)


def test_evaluation_without_a_checkpoint_is_refused_unless_asked_for(in_tmp_path, fast_args, capsys):
    """validate, test and predict without a checkpoint would score untrained weights: refused in one line, unless
    --untrained_weights true asks for exactly that."""
    for subcommand in ("validate", "test", "predict"):
        message = exit_message(main, subcommand, *fast_args)
        assert message.startswith(f"error: {subcommand} needs --ckpt_path") and "--untrained_weights true" in message
    message = exit_message(main, "test", *fast_args, "--ckpt_path", "x.ckpt", "--untrained_weights", "true")
    assert "contradict" in message
    main(["validate", *fast_args, "--untrained_weights", "true"])
    assert "val/acc" in capsys.readouterr().out


def _rows(path: Path) -> int:
    with path.open() as file:
        return sum(1 for _ in csv.DictReader(file))


@pytest.mark.slow
def test_evaluation_uses_the_whole_split_unless_a_limit_is_given(run_copy, capsys):
    """The run's saved two-batch limit is not applied to an evaluation; a limit on the command line is, and said."""
    assert yaml.safe_load((RUN / "config.yaml").read_text())["trainer"]["limit_predict_batches"] == 2
    main(["predict", "--accelerator", "cpu", "--ckpt_path", str(LAST), "--predictions.path", "all.csv"])
    assert "part of" not in capsys.readouterr().out
    limit = ["--trainer.limit_predict_batches", "3"]
    main(["predict", "--ckpt_path", str(LAST), *limit, "--predictions.path", "three.csv"])
    line = "predict on part of the prediction data only (--trainer.limit_predict_batches 3"
    assert line in capsys.readouterr().out
    batch = yaml.safe_load((RUN / "config.yaml").read_text())["data"]["init_args"]["batch_size"]
    assert _rows(Path("three.csv")) == 3 * batch and _rows(Path("all.csv")) > 3 * batch


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_evaluating_twice_into_the_same_logger_version_is_refused(run_copy, fast_args):
    """A second evaluation with the same logger version would delete the first one's metrics.csv: refused."""
    same = ["validate", *fast_args, "--ckpt_path", str(LAST), "--trainer.logger.init_args.version", "0"]
    main(same)
    first = RUN / "validate" / "version_0" / "metrics.csv"
    before = _digest(first)
    message = exit_message(main, *same)
    assert "holds an earlier run" in message and "--trainer.logger.init_args.version" in message
    assert _digest(first) == before


@pytest.mark.slow
def test_evaluating_a_checkpoint_uses_its_runs_settings(in_tmp_path, fast_args, capsys):
    """validate --ckpt_path, with no --config, evaluates the data the checkpoint was trained on, and writes its
    logs into that run's folder, with no word on the checkpoints it does not write; a flag that changes the data
    is allowed, and said loudly."""
    trained_with = ["--data.seed", "7", "--data.batch_size", "32"]
    main([*fast_args, "--max_epochs", "1", *trained_with])
    final = epoch_metrics(0)[0]
    run = RUNS / "version_0"
    evaluate = ["validate", "--accelerator", "cpu", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main([*evaluate, "--trainer.limit_val_batches", "2"])  # the training's batches: a saved limit is not applied
    assert not [w for w in caught if "dirpath" in str(w.message)], "a warning about checkpoints it does not write"
    with (run / "validate" / "version_0" / "metrics.csv").open() as file:
        evaluated = next(csv.DictReader(file))
    assert float(evaluated["val/acc"]) == pytest.approx(float(final["val/acc"]), abs=1e-6)
    assert sorted(path.name for path in RUNS.iterdir()) == ["version_0"], "no new, empty run folder"
    main([*evaluate, "--data.seed", "8"])
    assert "warning: --data.seed 8 differs from the 7 the checkpoint was trained with" in capsys.readouterr().out
