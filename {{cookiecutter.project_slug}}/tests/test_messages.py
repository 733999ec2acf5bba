"""A mistake the person can fix from the command line ends in one line, never a traceback."""

import pytest

from {{ cookiecutter.project_slug }}.cli import main


def test_a_trainer_argument_lightning_refuses_against_the_data_is_one_line(in_tmp_path, synthetic_config):
    """A Trainer argument that only the data's size shows to be wrong ends in one line naming it, not a traceback."""
    args = ["--config", synthetic_config, "--accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--trainer.limit_train_batches", "3", "--trainer.val_check_interval", "1000"])
    message = str(exit_info.value.code)
    assert message.startswith("error: --trainer.val_check_interval: `val_check_interval` (1000)"), message
    assert "\n" not in message
