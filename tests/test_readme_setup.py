"""The generated README's "Install" steps, followed literally on a fresh bake, down to a first commit.

Each command of the section's bash block runs in order in the project's folder, with this
environment's tools first on PATH; the two that make the project's own environment
(a venv, `pip install -e ".[dev]"`) are the only ones this environment stands in for.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

# What this environment already is: the project's venv, with the project and its dev extra installed.
STANDS_IN_FOR = {"python -m venv .venv && source .venv/bin/activate", 'pip install -e ".[dev]"'}


def install_commands(readme: str) -> list[str]:
    """The commands of the first bash block under "## Install", comments dropped."""
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [command for command in commands if command and not command.startswith("#")]


def environment(root: Path, tmp_path: Path) -> dict[str, str]:
    """This environment's tools first on PATH, the project importable as if installed; git and pre-commit kept
    from the machine's own settings and caches."""
    bin_dir = Path(sys.executable).parent
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(root / "src"),
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit"),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Template Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Template Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }


@pytest.mark.slow
@pytest.mark.parametrize("task", ["image", "sequence"])
def test_the_readmes_install_steps_work_on_a_fresh_bake_and_its_first_commit_runs_the_hooks(bake, tmp_path, task):
    """Every install command succeeds as written; the first commit then passes through each pre-commit hook."""
    root = bake(task=task)
    env = environment(root, tmp_path)
    commands = install_commands((root / "README.md").read_text(encoding="utf-8"))
    assert set(commands) >= STANDS_IN_FOR and "pre-commit install" in commands, commands

    for command in commands:
        if command in STANDS_IN_FOR:
            continue
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=HANG_GUARD_S,
        )
        assert done.returncode == 0, f"$ {command}\n{done.stdout}{done.stderr}"
    assert (root / ".git/hooks/pre-commit").is_file()

    for command in (["git", "add", "-A"], ["git", "commit", "-q", "-m", "A fresh bake"]):
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD_S
        )
        assert done.returncode == 0, f"$ {' '.join(command)}\n{done.stdout}{done.stderr}"
    assert "no manual device placement" in done.stdout + done.stderr and "Failed" not in done.stdout + done.stderr
