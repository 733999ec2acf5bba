"""Files a user names: only plain files are read, and an output goes only where a file can be written whole."""

import os
import re
import sys

import pytest
from image_project.cli import main

from lightning_kit.checkpoints import AtomicCheckpointIO
from lightning_kit.errors import ConfigError, UserError
from lightning_kit.files import TEMPORARY_PREFIX, NotAFileError, check_output_file, open_regular

FLAGS = {"flag": "--out", "overwrite_flag": "--force"}
needs_fifos = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
needs_dev_null = pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null on this system")


def test_only_a_plain_file_is_opened_for_reading(tmp_path, make_fifo):
    """A FIFO, a device or a folder is refused by name without being opened; a file or a link to one is read."""
    (tmp_path / "a.bin").write_bytes(b"data")
    (tmp_path / "link.bin").symlink_to(tmp_path / "a.bin")
    for name in ("a.bin", "link.bin"):
        with open_regular(tmp_path / name) as file:
            assert file.read() == b"data"
    for path, kind in [(make_fifo(tmp_path / "pipe"), "a FIFO (named pipe)"), (tmp_path, "a folder")]:
        with pytest.raises(NotAFileError, match="^" + re.escape(f"{path} is {kind}, not a file")):
            open_regular(path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


@needs_dev_null
def test_a_device_is_neither_read_nor_written():
    """/dev/null would read as an empty file, and as root an output there would replace the device itself."""
    with pytest.raises(NotAFileError, match=r"^/dev/null is a character device, not a file"):
        open_regular("/dev/null")
    with pytest.raises(ConfigError, match=r"^--out /dev/null is a character device, not a file"):
        check_output_file("/dev/null", overwrite=True, **FLAGS)


@pytest.mark.parametrize(
    ("make", "given", "expected"),
    [
        (lambda tmp: (tmp / "out").mkdir(), "out", "--out {tmp}/out names a folder"),
        (lambda tmp: None, "new/", "--out {tmp}/new/ names a folder"),
        pytest.param(
            lambda tmp: os.mkfifo(tmp / "out"),
            "out",
            "--out {tmp}/out is a FIFO (named pipe), not a file",
            marks=needs_fifos,
        ),
        (
            lambda tmp: (tmp / "file").write_text("x"),
            "file/out",
            "--out {tmp}/file/out cannot be written ({tmp}/file is",
        ),
        (lambda tmp: (tmp / "out").write_text("x"), "out", "--out {tmp}/out exists: give another --out, or --force"),
        (lambda tmp: (tmp / "out").symlink_to(tmp / "gone"), "out", "--out {tmp}/out is a link: give another --out"),
    ],
    ids=["folder", "trailing separator", "fifo", "under a file", "exists", "dangling link"],
)
def test_an_output_that_cannot_be_written_whole_is_one_line_naming_the_flag(tmp_path, make, given, expected):
    """Refused before anything is written, in one line; nothing is left behind by the check."""
    make(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UserError, match="^" + re.escape(expected.format(tmp=tmp_path))) as caught:
        check_output_file(f"{tmp_path}/{given}", overwrite=False, **FLAGS)
    assert "\n" not in str(caught.value)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("given", ["", " "])
def test_an_empty_output_path_is_one_line_not_the_working_folder(given):
    """An empty path (an unset shell variable) is no file: refused as such, not as the folder "." it would become."""
    with pytest.raises(ConfigError, match=r"^--out is empty: give the path of a file to write$"):
        check_output_file(given, overwrite=True, **FLAGS)


def test_overwrite_replaces_a_file_or_a_link_but_never_a_folder_or_a_fifo(tmp_path, make_fifo):
    """With overwrite, a file or a link may be replaced; a folder, a FIFO or a device is still refused."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    for name in ("file", "link", "new/deeper/out"):
        check_output_file(tmp_path / name, overwrite=True, **FLAGS)
    assert not (tmp_path / "new").exists()  # the check makes no folders
    for path in (tmp_path, make_fifo(tmp_path / "pipe")):
        with pytest.raises(ConfigError, match=r"^--out "):
            check_output_file(path, overwrite=True, **FLAGS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_output_in_a_folder_no_file_can_be_made_in_is_refused():
    """/proc takes no new files, not even from root, whom permissions do not stop."""
    with pytest.raises(ConfigError, match=re.escape("--out /proc/out.csv cannot be written (")):
        check_output_file("/proc/out.csv", overwrite=False, **FLAGS)


@pytest.mark.parametrize(
    "given",
    ["{tmp}/out/", "{tmp}/out", pytest.param("{tmp}/pipe.csv", marks=needs_fifos), "{tmp}/file.csv/out.csv"],
)
def test_predictions_that_cannot_be_written_stop_predict_before_it_starts(in_tmp_path, fast_args, given, request):
    """--predictions.path a folder, a FIFO or a path under a file ends in one line naming the flag, before any work."""
    (in_tmp_path / "out").mkdir()
    (in_tmp_path / "file.csv").write_text("x")
    if "pipe" in given:
        request.getfixturevalue("make_fifo")(in_tmp_path / "pipe.csv")
    path = given.format(tmp=in_tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(["predict", *fast_args, "--untrained_weights", "true", "--predictions.path", path])
    assert str(caught.value).startswith(f"error: --predictions.path {path} ")
    assert "\n" not in str(caught.value)
    assert not (in_tmp_path / "runs").exists()  # stopped before the run began


def test_a_link_planted_at_a_saves_temporary_name_is_replaced_not_written_through(tmp_path):
    """A checkpoint save never writes through a link standing at its temporary file's name."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    path = tmp_path / "checkpoints" / "last.ckpt"
    path.parent.mkdir()
    (path.parent / f"{TEMPORARY_PREFIX}{os.getpid()}.{path.name}").symlink_to(outside)
    AtomicCheckpointIO().save_checkpoint({"global_step": 3}, path)
    assert outside.read_text() == "keep me"
    assert path.is_file() and not path.is_symlink()
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
