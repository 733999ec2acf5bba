"""A configuration file is read as data: one that is not a small text file is refused in one line naming it."""

import shutil

import pytest
from conftest import refused
from image_project.cli import main

from lightning_kit.config_files import MAX_BYTES, MAX_VALUES


def _billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "is not a text file"),
        (b"model:\n  lr: 0.001\n\x00\x00", "is not a text file"),
        (b"model:\n  x: '" + b"a" * (MAX_BYTES + 1) + b"'\n", f"is over {MAX_BYTES >> 20} MiB"),
        (_billion_laughs().encode(), f"expand to over {MAX_VALUES} values"),
        (b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nests deeper"),
    ],
    ids=["binary", "nul-bytes", "too-large", "billion-laughs", "deep-nesting"],
)
@pytest.mark.parametrize("given_as", ["--config", "--trainer", "--data"])
def test_a_configuration_file_that_is_not_a_small_text_file_is_one_line_naming_it(
    in_tmp_path, synthetic_config, capsys, content, expected, given_as
):
    """A binary, oversized, endlessly expanding or too deeply nested file stops in one line, whatever flag reads it."""
    config = in_tmp_path / "bad.yaml"
    config.write_bytes(content)
    message = refused(["--config", synthetic_config, given_as, str(config)], capsys)
    assert expected in message and "bad.yaml" in message, message


def test_a_run_config_that_expands_without_bound_is_one_line_naming_it(in_tmp_path, trained_once):
    """A run folder's config.yaml, read to evaluate its checkpoint, is held to the same bounds."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "shared")
    run = in_tmp_path / "shared" / "lightning_logs" / "version_0"
    (run / "config.yaml").write_text(_billion_laughs())
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    message = str(exit_info.value.code)
    assert message.startswith("error: ") and f"config.yaml: its aliases (*name) expand to over {MAX_VALUES}" in message


@pytest.mark.parametrize("content", ["", "# only a comment\n"], ids=["empty", "comment"])
def test_an_empty_config_file_is_said_to_be_empty(in_tmp_path, capsys, content):
    """Not jsonargparse's 'Unexpected config: ' with nothing after it."""
    config = in_tmp_path / "empty.yaml"
    config.write_text(content)
    message = refused(["--config", str(config)], capsys)
    assert message.startswith(f"error: --config {config} is empty: "), message
