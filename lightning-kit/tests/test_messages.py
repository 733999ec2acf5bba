"""A mistake the person can fix from the command line ends in one line, never a traceback."""

import sys

import pytest
from conftest import refused
from image_project.cli import main


def test_a_trainer_argument_lightning_refuses_against_the_data_is_one_line(in_tmp_path, synthetic_config):
    """A Trainer argument that only the data's size shows to be wrong ends in one line naming it, not a traceback."""
    args = ["--config", synthetic_config, "--accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--trainer.limit_train_batches", "3", "--trainer.val_check_interval", "1000"])
    message = str(exit_info.value.code)
    assert message.startswith("error: --trainer.val_check_interval: `val_check_interval` (1000)"), message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--accelerator", "tpu"], "--accelerator tpu needs torch_xla"),
        (["--accelerator", "cpu", "--devices", "64"], "--devices 64 on the CPU would start 64 processes"),
        (["--model.lr", "-1"], "--model.lr must be v>0"),
        (["--model.weight_decay", "-0.1"], "--model.weight_decay must be v>=0"),
    ],
    ids=["tpu", "too-many-processes", "negative-lr", "negative-weight-decay"],
)
def test_mistakes_on_the_command_line_are_one_line(in_tmp_path, synthetic_config, capsys, flags, message):
    """Each ends in one line naming the flag, before a run folder is made: the Classifier's values out of their types'
    bounds as the parser reads them (exit status 2), the accelerators as the command line checks them."""
    assert refused(["--config", synthetic_config, *flags], capsys).startswith(f"error: {message}")


@pytest.mark.skipif(sys.platform != "linux", reason="/sys refuses new files on Linux, to root too")
def test_an_output_folder_that_cannot_be_written_is_one_line(in_tmp_path, fast_args):
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--max_epochs", "1", "--trainer.logger.init_args.save_dir", "/sys/runs"])
    assert str(exit_info.value.code).startswith("error: cannot write /sys/runs")


def test_a_write_past_the_file_size_limit_is_one_line_naming_the_file(tmp_path):
    """A real ``EFBIG``: under ``ulimit -f`` (RLIMIT_FSIZE, whose signal Python ignores) a write past the limit fails;
    the line names the file and what to do."""
    import resource

    from lightning_kit.messages import errors_as_messages

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    target = tmp_path / "big.bin"
    with pytest.raises(SystemExit) as exit_info, errors_as_messages():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        try:
            with open(target, "wb") as file:
                file.write(b"\0" * 65536)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(exit_info.value.code)
    assert message.startswith(f"error: cannot write {target}: File too large") and "ulimit -f" in message, message


def test_a_password_in_a_message_is_hidden():
    """Whatever the error says, a --storage URL in it is shown without its password."""
    from lightning_kit.errors import ConfigError
    from lightning_kit.messages import errors_as_messages

    with pytest.raises(SystemExit) as exit_info, errors_as_messages():
        raise ConfigError("--storage postgresql+psycopg://team:Hush%40Kx9q@127.0.0.1:1/studies cannot be reached")
    shown = "error: --storage postgresql+psycopg://team:***@127.0.0.1:1/studies cannot be reached"
    assert str(exit_info.value.code) == shown
