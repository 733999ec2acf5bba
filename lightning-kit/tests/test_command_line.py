"""A command line is read once, in one grammar (``command_line.CommandLine``), by every check made before
jsonargparse parses it: which flag each value belongs to."""

import pytest

from lightning_kit.command_line import CommandLine


def test_each_value_belongs_to_its_flag_in_every_form_argparse_takes():
    line = CommandLine(
        ["fit", "--a", "1", "--b=2", "-c", "x.yaml", "--model.lr", "-3", "--flag", "--ckpt_path", "last"]
    )
    assert line.pairs == [("--a", "1"), ("--b", "2"), ("-c", "x.yaml"), ("--model.lr", "-3"), ("--ckpt_path", "last")]
    assert line.last("--ckpt_path") == "last" and line.last("--flag") is None
    assert line.gives("--flag") and line.gives("--b") and not line.gives("--c")
    assert line.values("-c", "--config") == ["x.yaml"]
    assert tuple(line) == (
        "fit",
        "--a",
        "1",
        "--b=2",
        "-c",
        "x.yaml",
        "--model.lr",
        "-3",
        "--flag",
        "--ckpt_path",
        "last",
    )


def test_it_is_read_once_however_often_a_check_asks():
    line = CommandLine(["--data", "x.Y"])
    assert CommandLine.of(line) is line
    assert CommandLine.of(["--data", "x.Y"]) == line


@pytest.mark.parametrize(
    ("args", "values", "rest"),
    [
        (["--gpu_memory", "24GB", "--data", "x"], ["24GB"], ["--data", "x"]),
        (["--data", "x", "--gpu_memory=H100"], ["H100"], ["--data", "x"]),
        (["--data", "x", "--gpu_memory"], [None], ["--data", "x"]),
        (["--gpu_memory", "--data", "x"], [None], ["--data", "x"]),
    ],
)
def test_a_flag_is_taken_out_with_its_value_in_either_form(args, values, rest):
    taken, kept = CommandLine(args).split(lambda flag, value: flag == "--gpu_memory")
    assert taken == values and list(kept) == rest and isinstance(kept, CommandLine)


def test_each_argument_is_named_by_its_flag_for_messages():
    named = CommandLine(["fit", "--config", "a.yaml", "--data=x"]).named()
    assert named == [("an argument", "fit"), ("--config", "--config"), ("--config", "a.yaml"), ("--data", "--data=x")]
