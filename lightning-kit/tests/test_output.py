"""A command's standard output that cannot take what it prints ends the command in one line, never a traceback.

A full disk or a file-size limit under a redirect (``> runs.txt``), a reader that has gone (``| head``), an
encoding that cannot hold a run's name (``PYTHONIOENCODING=ascii``, a C locale), a stream closed at the start
(``>&-``): ``errors.command`` guards every command's ``main`` against each.
"""

import errno
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

from lightning_kit import bench as bench_command
from lightning_kit import cli, errors, export, guide, placement, views
from lightning_kit import gpu_check as gpu_check_command
from lightning_kit.runs import command as runs
from lightning_kit.serve import command as serve
from lightning_kit.sweep import command as sweep

FULL = "error: the standard output cannot be written: "


class _Refusing:
    """A standard output that fails as a full disk does: every write, or only the flush of what was buffered."""

    def __init__(self, code: int, on: str) -> None:
        self.code, self.on, self.written = code, on, []

    def write(self, text: str) -> int:
        if self.on == "write":
            raise OSError(self.code, os.strerror(self.code))
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if self.on == "flush" and self.written:
            raise OSError(self.code, os.strerror(self.code))


def test_every_command_of_the_library_is_guarded():
    mains = [cli.main, export.main, views.main, guide.main, runs.main, serve.main, sweep.main]
    mains += [placement.main, bench_command.main, gpu_check_command.main]
    unguarded = [main.__module__ for main in mains if getattr(main, "__wrapped__", None) is None]
    assert not unguarded, f"main not wrapped in errors.command: {unguarded}"


@pytest.mark.parametrize("on", ["write", "flush"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EIO])
def test_an_output_that_cannot_be_written_is_one_line(monkeypatch, code, on):
    refusing = _Refusing(code, on)
    monkeypatch.setattr(sys, "stdout", refusing)

    @errors.command
    def main() -> None:
        print("a table")

    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == f"{FULL}{os.strerror(code)}"
    assert sys.stdout is refusing, "the command's own standard output is given back"


def test_what_a_command_that_stops_left_buffered_is_flushed_before_it_exits(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Refusing(errno.ENOSPC, "flush"))

    @errors.command
    def main() -> None:
        print("a table")
        sys.exit(3)

    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == f"{FULL}No space left on device"


def test_a_reader_that_has_gone_ends_the_command_quietly(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Refusing(errno.EPIPE, "write"))

    @errors.command
    def main() -> None:
        print("a table")

    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 1


def test_an_error_of_the_commands_own_files_is_not_taken_for_the_output(monkeypatch, tmp_path):
    """Only the standard output's failures are the output's: a file the command writes fails as it did."""

    @errors.command
    def main() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "model.pt2"))

    with pytest.raises(OSError, match=r"model\.pt2"):
        main()


# --- the same, in processes of their own, as a user's shell starts them ----------------------------------------


@pytest.fixture
def run_folder(trained_once, tmp_path) -> Path:
    """A copy of a short run, the run's folder renamed with a letter outside ASCII."""
    shutil.copytree(trained_once / "runs", tmp_path / "runs")
    (tmp_path / "runs/lightning_logs/version_0").rename(tmp_path / "runs/lightning_logs/rün")
    return tmp_path


def _command(module: str, *args: str, cwd: Path, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=HANG_GUARD_S,
        **popen,
    )


def _lint_target(folder: Path) -> str:
    (folder / "placed.py").write_text("import torch\n\nx = torch.zeros(1).cuda()\n", encoding="utf-8")
    return "placed.py"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("module", ["lightning_kit.runs", "lightning_kit.guide", "lightning_kit.lint_placement"])
def test_a_full_disk_under_the_output_is_one_line(run_folder, module):
    args = [_lint_target(run_folder)] if module.endswith("lint_placement") else []
    with open("/dev/full", "w") as full:
        done = _command(module, *args, cwd=run_folder, stdout=full)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"{FULL}No space left on device\n", done.stderr


@pytest.mark.parametrize("module", ["lightning_kit.lint_placement", "lightning_kit.guide", "lightning_kit.runs"])
def test_a_file_size_limit_under_the_output_is_one_line(run_folder, module):
    """A command that prints line by line meets the limit at a write; one whose output goes in one write (the
    guide, a table) has it written up to the limit, which Python takes for done without an error: told all the
    same, from where the output stopped."""
    args = [_lint_target(run_folder)] if module.endswith("lint_placement") else []

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.RLIM_INFINITY))

    with (run_folder / "out.txt").open("w") as out:
        done = _command(module, *args, cwd=run_folder, stdout=out, preexec_fn=limited)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"{FULL}File too large\n", done.stderr


@pytest.mark.parametrize("module", ["lightning_kit.guide", "lightning_kit.runs"])
def test_a_reader_gone_before_the_output_ends_the_command_quietly(run_folder, module):
    process = subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=run_folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # `| head -0`: nobody reads what it prints
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 1 and err == "", err


@pytest.mark.parametrize(
    "environment", [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}]
)
def test_a_name_the_outputs_encoding_cannot_hold_is_written_escaped(run_folder, environment):
    done = _command("lightning_kit.runs", cwd=run_folder, env=environment, stdout=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # Escaped: as a letter where the locale decodes the name (\xfc), as its bytes where it cannot (\udcc3\udcbc).
    assert "lightning_logs/r\\" in done.stdout or "rün" in done.stdout, done.stdout


def test_a_closed_output_is_an_empty_one(run_folder):
    done = _command("lightning_kit.runs", cwd=run_folder, stdout=None, preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
