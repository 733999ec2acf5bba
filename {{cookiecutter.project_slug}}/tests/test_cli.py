import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from {{ cookiecutter.project_slug }}.cli import build_all, expand_shortcuts, main


def test_shortcuts_expand_to_trainer_flags():
    assert expand_shortcuts(["--accelerator", "gpu"]) == ["--trainer.accelerator", "gpu"]
    assert expand_shortcuts(["test", "--devices=2", "--model.lr", "1"]) == [
        "test",
        "--trainer.devices=2",
        "--model.lr",
        "1",
    ]
    assert expand_shortcuts(["--max_epochsx", "3"]) == ["--max_epochsx", "3"]


def test_without_a_subcommand_fit_runs(in_tmp_path, fast_args, capsys):
    """`train.py --accelerator cpu ...` trains, as `train.py fit ...` does."""
    main([*fast_args, "--max_epochs", "1"])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("fit", "validate", "test", "predict"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_gpu_without_a_gpu_exits_with_a_short_message(in_tmp_path, fast_args):
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--accelerator", "gpu"])
    message = str(exit_info.value.code)
    assert message.startswith("error:") and "no CUDA GPU" in message and "--accelerator cpu" in message
    assert not (in_tmp_path / "runs").exists()


@pytest.mark.slow
def test_fit_then_each_subcommand_from_its_checkpoint(in_tmp_path, fast_args, capsys):
    """fit writes a best and a last checkpoint; validate, test and predict run from it."""
    main([*fast_args, "--max_epochs", "1"])
    assert "fit finished" in capsys.readouterr().out
    checkpoints = sorted(path.name for path in in_tmp_path.glob("runs/lightning_logs/version_0/checkpoints/*.ckpt"))
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2
    last = str(in_tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt")
    for subcommand in ("validate", "test", "predict"):
        main([subcommand, *fast_args, "--ckpt_path", last])
    out = capsys.readouterr().out
    assert "val/acc" in out and "test/acc" in out


def test_the_progress_bar_redraws_every_20_steps(in_tmp_path, synthetic_config):
    """A bar redrawn every step costs time on every step; when shown, it is redrawn every 20."""
    _, _, trainer = build_all(["--config", synthetic_config, "--trainer.enable_progress_bar", "true"])
    assert isinstance(trainer.progress_bar_callback, TQDMProgressBar)
    assert trainer.progress_bar_callback.refresh_rate == 20
    _, _, quiet = build_all(["--config", synthetic_config, "--trainer.enable_progress_bar", "false"])
    assert quiet.progress_bar_callback is None
