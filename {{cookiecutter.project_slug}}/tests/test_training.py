"""Training from the command line with one flag more: bf16 mixed precision on the CPU, TensorBoard logging."""

from pathlib import Path

import pytest
from conftest import RUNS

from {{ cookiecutter.project_slug }}.cli import main


@pytest.mark.slow
def test_bf16_mixed_precision_trains_on_the_cpu(in_tmp_path, fast_args, capsys):
    main([*fast_args, "--max_epochs", "1", "--precision", "bf16-mixed"])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


@pytest.mark.slow
def test_tensorboard_logging_with_one_flag(in_tmp_path, fast_args, synthetic_config):
    pytest.importorskip("tensorboard", reason="TensorBoard comes with the dev extra")
    main([*fast_args, "--max_epochs", "1", "--config", str(Path(synthetic_config).with_name("tensorboard.yaml"))])
    assert list(RUNS.glob("version_0/events.out.tfevents.*"))
