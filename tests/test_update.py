"""A baked project takes the template's later changes with `cruft update`, keeping the user's own.

Each test works as a team would: the template is a git repository (a copy of this one,
committed), the project is baked from it with plain `cookiecutter` and kept in git, the
user commits changes of their own, and the template gets a second commit. Every command
runs as a subprocess with no terminal and nothing on stdin.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

TEMPLATE = Path(__file__).resolve().parents[1]
# Not part of the template: the template's own environment, outputs and caches.
NOT_TEMPLATE = {".git", ".venv", "build"}
CACHES = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache", "*.pyc")
PROJECT_TEMPLATE = "{{cookiecutter.project_slug}}"
IDENTITY = {
    "GIT_AUTHOR_NAME": "Template Test",
    "GIT_AUTHOR_EMAIL": "template-test@example.com",
    "GIT_COMMITTER_NAME": "Template Test",
    "GIT_COMMITTER_EMAIL": "template-test@example.com",
}
# The user's change and the template's, on the README's first line or at its end.
USER_TITLE = "# Vision Project, our fork\n"
TEMPLATE_TITLE = "# {{ cookiecutter.project_name }}: a Lightning project\n"
TEMPLATE_LINE = "\nThis project follows its template: `cruft update` brings the template's changes.\n"
NEW_FILE = ("docs/updating.md", "# Updating {{ cookiecutter.project_name }}\n", "# Updating Vision Project\n")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A git identity, no global or system git settings, and a cookiecutter config inside tmp_path."""
    config = tmp_path / "cookiecutterrc.yaml"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'cookiecutters'}\nreplay_dir: {tmp_path / 'replay'}\n")
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    return {
        **inherited,
        **IDENTITY,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "COOKIECUTTER_CONFIG": str(config),
    }


def run(*command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def git(*args: str, cwd: Path, env: dict[str, str]) -> str:
    done = run("git", *args, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def commit(folder: Path, message: str, env: dict[str, str]) -> str:
    """Commit everything in folder, in a new repository if it has none; return the commit."""
    if not (folder / ".git").exists():
        git("init", "-q", cwd=folder, env=env)
    git("add", "-A", cwd=folder, env=env)
    git("commit", "-q", "-m", message, cwd=folder, env=env)
    return git("rev-parse", "HEAD", cwd=folder, env=env).strip()


def cruft(*args: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "cruft", *args, cwd=project, env=env)


def copy_template(target: Path) -> Path:
    """The template's working tree, without its git folder, environment, outputs and caches."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(CACHES(folder, names)) | (NOT_TEMPLATE & set(names) if Path(folder) == TEMPLATE else set())

    shutil.copytree(TEMPLATE, target, ignore=ignore, symlinks=True)
    return target


@pytest.fixture
def template(tmp_path, env) -> Path:
    """A git repository holding the template as it is now: commit 1."""
    folder = copy_template(tmp_path / "template")
    commit(folder, "commit 1", env)
    return folder


def cookiecutter(tmp_path: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess:
    """`cookiecutter template` from the template's parent folder, as a user types it."""
    command = [sys.executable, "-m", "cookiecutter", "--no-input", *options, "-o", "projects", "template"]
    return run(*command, cwd=tmp_path, env=env)


def bake(tmp_path: Path, env: dict[str, str], *options: str) -> Path:
    """Bake with cookiecutter; return the project."""
    done = cookiecutter(tmp_path, env, *options)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / "projects" / "vision_project"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path.name}: {old!r} is not there once"
    path.write_text(text.replace(old, new), encoding="utf-8")


def change_template(template: Path, env: dict[str, str], *, title: bool) -> str:
    """Commit 2: a line at the end of the README (or a new title), and a new file; return the commit."""
    readme = template / PROJECT_TEMPLATE / "README.md"
    if title:
        edit(readme, "# {{ cookiecutter.project_name }}\n", TEMPLATE_TITLE)
    else:
        readme.write_text(readme.read_text(encoding="utf-8") + TEMPLATE_LINE, encoding="utf-8")
    name, text, _ = NEW_FILE
    (template / PROJECT_TEMPLATE / name).write_text(text, encoding="utf-8")
    return commit(template, "commit 2", env)


def state(project: Path) -> dict:
    return json.loads((project / ".cruft.json").read_text(encoding="utf-8"))


def test_a_plain_cookiecutter_bake_records_the_template_and_commit_for_cruft(tmp_path, env, template):
    project = bake(tmp_path, env)
    recorded = state(project)
    first = git("rev-parse", "HEAD", cwd=template, env=env).strip()
    assert recorded["template"] == str(template.resolve()), "cruft needs an absolute path, not the one typed"
    assert recorded["commit"] == first and recorded["checkout"] is None and recorded["directory"] is None
    assert recorded["skip"] == [".git", "data/", "runs/"]
    answers = recorded["context"]["cookiecutter"]
    assert answers["task"] == "image" and answers["project_slug"] == "vision_project"
    assert answers["_template"] == recorded["template"] and answers["_commit"] == first
    assert not {"_output_dir", "_repo_dir", "_checkout", "__prompts__"} & answers.keys()
    own = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert own["_template"] == recorded["template"], "cruft's renders and the project would differ on this line"
    commit(project, "bake", env)
    check = cruft("check", project=project, env=env)
    assert check.returncode == 0 and "up to date" in check.stdout, check.stdout + check.stderr


def test_an_update_brings_the_templates_change_and_keeps_the_users(tmp_path, env, template):
    project = bake(tmp_path, env)
    commit(project, "bake", env)
    edit(project / "README.md", "# Vision Project\n", USER_TITLE)
    (project / "notes.md").write_text("Our own notes.\n", encoding="utf-8")
    commit(project, "our own change", env)
    second = change_template(template, env, title=False)

    check = cruft("check", project=project, env=env)
    assert check.returncode != 0 and "out of date" in check.stdout, check.stdout + check.stderr
    update = cruft("update", "--skip-apply-ask", project=project, env=env)
    assert update.returncode == 0, update.stdout + update.stderr
    assert "conflict" not in update.stdout + update.stderr

    readme = (project / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(USER_TITLE), "the user's change was lost"
    assert readme.endswith(TEMPLATE_LINE), "the template's change did not arrive"
    assert (project / "notes.md").read_text(encoding="utf-8") == "Our own notes.\n"
    name, _, rendered = NEW_FILE
    assert (project / name).read_text(encoding="utf-8") == rendered
    assert state(project)["commit"] == second and state(project)["context"]["cookiecutter"]["_commit"] == second
    check = cruft("check", project=project, env=env)
    assert check.returncode == 0 and "up to date" in check.stdout, check.stdout + check.stderr


def test_a_conflict_is_marked_in_the_file_with_the_users_line_kept(tmp_path, env, template):
    """With the bake in the project's history, git merges three ways: conflict markers, the file unmerged."""
    project = bake(tmp_path, env)
    commit(project, "bake", env)
    edit(project / "README.md", "# Vision Project\n", USER_TITLE)
    commit(project, "our own title", env)
    second = change_template(template, env, title=True)

    update = cruft("update", "--skip-apply-ask", project=project, env=env)
    # Cruft says so in git's words on stderr, yet exits 0 with its usual "Good work!".
    assert update.returncode == 0, update.stdout + update.stderr
    assert "Applied patch to 'README.md' with conflicts." in update.stderr, update.stderr
    assert "UU README.md" in git("status", "--porcelain", cwd=project, env=env).splitlines()
    readme = (project / "README.md").read_text(encoding="utf-8")
    ours, theirs = USER_TITLE, "# Vision Project: a Lightning project\n"
    assert readme.startswith(f"<<<<<<< ours\n{ours}=======\n{theirs}>>>>>>> theirs\n"), readme[:300]
    name, _, rendered = NEW_FILE
    assert (project / name).read_text(encoding="utf-8") == rendered, "the change without a conflict did not arrive"
    assert state(project)["commit"] == second


def test_without_the_bake_in_git_history_a_conflict_is_left_in_a_rej_file(tmp_path, env, template):
    """A project first committed with the user's edits in: no three-way merge, the hunk goes to README.md.rej."""
    project = bake(tmp_path, env)
    edit(project / "README.md", "# Vision Project\n", USER_TITLE)
    commit(project, "bake, with our own title", env)
    user_readme = (project / "README.md").read_text(encoding="utf-8")
    second = change_template(template, env, title=True)

    update = cruft("update", "--skip-apply-ask", project=project, env=env)
    assert update.returncode == 0, update.stdout + update.stderr
    output = update.stdout + update.stderr
    assert "*.rej files" in output and "resolve those conflicts manually" in output, output
    assert (project / "README.md").read_text(encoding="utf-8") == user_readme
    rejected = (project / "README.md.rej").read_text(encoding="utf-8")
    assert "-# Vision Project\n" in rejected and "+# Vision Project: a Lightning project\n" in rejected
    name, _, rendered = NEW_FILE
    assert (project / name).read_text(encoding="utf-8") == rendered
    assert state(project)["commit"] == second


def test_a_re_bake_keeps_the_projects_own_cruft_file(tmp_path, env, template):
    """`cookiecutter -f` over the project leaves .cruft.json as the user had it, though the template moved on."""
    project = bake(tmp_path, env)
    recorded = state(project)
    recorded["skip"].append("notebooks/")
    (project / ".cruft.json").write_text(json.dumps(recorded, indent=4) + "\n", encoding="utf-8")
    before = (project / ".cruft.json").read_bytes()
    change_template(template, env, title=False)

    bake(tmp_path, env, "-f")
    assert (project / ".cruft.json").read_bytes() == before
    own = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert own["_template"] == recorded["template"]


def test_a_template_outside_git_bakes_with_one_line_saying_how_to_link_later(tmp_path, env):
    """No commit to record: no .cruft.json, one line naming `cruft link`, and the bake succeeds."""
    copy_template(tmp_path / "template")
    done = cookiecutter(tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    project = tmp_path / "projects" / "vision_project"
    assert not (project / ".cruft.json").exists()
    notes = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(notes) == 1 and "cruft link" in notes[0] and "not a git checkout" in notes[0], notes
    assert json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))["_template"] == "template"
