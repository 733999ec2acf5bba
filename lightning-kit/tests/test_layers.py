"""The library's rooms import only from the rooms below them, with no circles anywhere: the contracts of
``[tool.importlinter]`` in lightning-kit/pyproject.toml, checked by import-linter."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

# The library's folder: its pyproject.toml holds the contracts, its src/ the package.
LIBRARY = Path(__file__).resolve().parents[1]
PACKAGE = "lightning_kit"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
DATA_MODULE = "image_splits"  # a data module built on data/memory.py


def lint_imports(source: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package found in ``source``, with the library's contracts."""
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed: pip install -e 'lightning-kit[test]'")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=LIBRARY,
        env={**os.environ, "PYTHONPATH": str(source), "COLUMNS": "500"},  # a reported import on one line
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def test_every_room_imports_only_from_the_rooms_below_it_and_nothing_circles():
    """Both contracts are kept by the library as it is."""
    linted = lint_imports(LIBRARY / "src")
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "Contracts: 2 kept, 0 broken." in linted.stdout


@pytest.mark.parametrize(
    ("module", "planted", "reported"),
    [
        # An upward import: the lowest room using the command line, named with its line.
        ("errors.py", "from .cli import main", rf"^- {PACKAGE}\.errors -> {PACKAGE}\.cli \(l\.LINE\)$"),
        # An upward import into the commands: the command line using the audit's command, which is built on it.
        (
            "cli.py",
            "from . import placement",
            rf"^- {PACKAGE}\.cli -> {PACKAGE}\.placement \(l\.LINE\)$",
        ),
        # The placement check, which imports no PyTorch, using the command line.
        (
            "lint_placement.py",
            "from . import cli",
            rf"^- {PACKAGE}\.lint_placement -> {PACKAGE}\.cli \(l\.LINE\)$",
        ),
        # A circle inside one room, named by its room: the in-memory base using the data module built on it.
        ("data/memory.py", f"from . import {DATA_MODULE}", rf"^No cycles are allowed in {PACKAGE}\.data\.$"),
        # Both at once inside the audit: the simulated device using the Lightning integration above it.
        (
            "gpu_audit/simulated/devices.py",
            "from .. import lightning",
            rf"^- {PACKAGE}\.gpu_audit\.simulated\.devices -> {PACKAGE}\.gpu_audit\.lightning \(l\.LINE\)$",
        ),
    ],
)
def test_a_planted_upward_import_or_circle_fails_naming_it(tmp_path, module, planted, reported):
    """The next change that adds a circle or an upward import fails, with a line naming the import."""
    shutil.copytree(LIBRARY / "src" / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / PACKAGE / module
    line = len(path.read_text(encoding="utf-8").splitlines()) + 1
    with path.open("a", encoding="utf-8") as file:
        file.write(f"{planted}  # noqa\n")
    linted = lint_imports(tmp_path)
    assert linted.returncode == 1, linted.stdout + linted.stderr
    assert "BROKEN" in linted.stdout
    assert re.search(reported.replace("LINE", str(line)), linted.stdout, flags=re.MULTILINE), linted.stdout
