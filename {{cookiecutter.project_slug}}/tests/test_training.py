"""Training from the command line: an evaluation takes its run's settings, mistakes are one line, bf16 and
TensorBoard with one flag."""

import csv
import sys
from pathlib import Path

import pytest
from conftest import RUNS, epoch_metrics

from {{ cookiecutter.project_slug }}.cli import main


@pytest.mark.slow
def test_evaluating_a_checkpoint_uses_its_runs_settings(in_tmp_path, fast_args, capsys):
    """validate --ckpt_path, with no --config, evaluates the data the checkpoint was trained on, and writes its
    logs into that run's folder; a flag that changes the data is allowed, and said loudly."""
    trained_with = ["--data.seed", "7", "--data.batch_size", "32"]
    main([*fast_args, "--max_epochs", "1", *trained_with])
    final = epoch_metrics(0)[0]
    run = RUNS / "version_0"
    evaluate = ["validate", "--accelerator", "cpu", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    main([*evaluate, "--trainer.limit_val_batches", "2"])  # the training's batches: a saved limit is not applied
    with (run / "validate" / "version_0" / "metrics.csv").open() as file:
        evaluated = next(csv.DictReader(file))
    assert float(evaluated["val/acc"]) == pytest.approx(float(final["val/acc"]), abs=1e-6)
    assert sorted(path.name for path in RUNS.iterdir()) == ["version_0"], "no new, empty run folder"
    main([*evaluate, "--data.seed", "8"])
    assert "warning: --data.seed 8 differs from the 7 the checkpoint was trained with" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--accelerator", "tpu"], "--accelerator tpu needs torch_xla"),
        (["--accelerator", "cpu", "--devices", "64"], "--devices 64 on the CPU would start 64 processes"),
        (["--model.lr", "-1"], "--model.lr must be a positive number"),
        (["--model.weight_decay", "-0.1"], "--model.weight_decay must be a number of at least 0"),
    ],
    ids=["tpu", "too-many-processes", "negative-lr", "negative-weight-decay"],
)
def test_mistakes_on_the_command_line_are_one_line(in_tmp_path, synthetic_config, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config, *flags])
    assert str(exit_info.value.code).startswith(f"error: {message}")
    assert not Path("runs").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="/sys refuses new files on Linux, to root too")
def test_an_output_folder_that_cannot_be_written_is_one_line(in_tmp_path, fast_args):
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--max_epochs", "1", "--trainer.logger.init_args.save_dir", "/sys/runs"])
    assert str(exit_info.value.code).startswith("error: cannot write /sys/runs")


@pytest.mark.slow
def test_bf16_mixed_precision_trains_on_the_cpu(in_tmp_path, fast_args, capsys):
    main([*fast_args, "--max_epochs", "1", "--precision", "bf16-mixed"])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


@pytest.mark.slow
def test_tensorboard_logging_with_one_flag(in_tmp_path, fast_args, synthetic_config):
    pytest.importorskip("tensorboard", reason="TensorBoard comes with the dev extra")
    main([*fast_args, "--max_epochs", "1", "--config", str(Path(synthetic_config).with_name("tensorboard.yaml"))])
    assert list(RUNS.glob("version_0/events.out.tfevents.*"))
