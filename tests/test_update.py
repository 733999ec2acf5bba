"""A baked project takes the template's later changes with `cruft update`, keeping the user's own.

Each test works as a team would: the template is a git repository (a copy of this one,
committed), the project is baked from it with plain `cookiecutter` and kept in git, the
user commits changes of their own, and the template gets a second commit. Every command
runs as a subprocess with no terminal and nothing on stdin.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    FRESH_TASK,
    FreshVenv,
    commit,
    cookiecutter_cli,
    copy_template,
    git,
    git_environment,
    library_requirements,
    run,
)

PROJECT_TEMPLATE = "{{cookiecutter.project_slug}}"
# The user's change and the template's, on the README's first line or at its end.
USER_TITLE = "# Vision Project, our fork\n"
TEMPLATE_TITLE = "# {{ cookiecutter.project_name }}: a Lightning project\n"
TEMPLATE_LINE = "\nThis project follows its template: `cruft update` brings the template's changes.\n"
NEW_FILE = ("docs/updating.md", "# Updating {{ cookiecutter.project_name }}\n", "# Updating Vision Project\n")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A git identity, no global or system git settings, and a cookiecutter config inside tmp_path."""
    return git_environment(tmp_path)


def cruft(*args: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "cruft", *args, cwd=project, env=env)


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
    assert library_references(project) == {(tmp_path / "template" / "lightning-kit").resolve().as_uri()}


def test_a_template_without_the_library_beside_it_bakes_with_one_line_saying_how_to_install_it(tmp_path, env):
    """The template's folder alone (no lightning-kit/ next to it): the bare requirements stay, and one line says so."""
    template = copy_template(tmp_path / "template")
    shutil.rmtree(template / "lightning-kit")
    commit(template, "the template alone", env)
    done = cookiecutter(tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    project = tmp_path / "projects" / "vision_project"
    notes = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(notes) == 1 and "lightning-kit was not found beside the template" in notes[0], notes
    assert library_requirements(project)[0] == "lightning-kit"
    assert all(" @ " not in text for text in library_requirements(project))


def library_references(project: Path) -> set[str]:
    """Where the project's pyproject.toml has pip find the library: each requirement's URL, extras included."""
    return {text.split(" @ ", 1)[1] for text in library_requirements(project)}


def test_a_bake_from_a_local_checkout_requires_the_library_in_that_folder(tmp_path, env, template):
    """A folder on this machine: the library beside the template, as it is there (pip builds what it finds)."""
    project = bake(tmp_path, env)
    assert library_references(project) == {(template.resolve() / "lightning-kit").as_uri()}


def test_a_bake_from_a_git_url_requires_the_library_at_the_commit_baked_and_an_update_moves_it(tmp_path, env, template):
    """`cookiecutter git+file:///...`: the library's folder in that repository at that commit, until cruft moves it."""
    first = git("rev-parse", "HEAD", cwd=template, env=env).strip()
    url = f"git+{template.as_uri()}"
    project = cookiecutter_cli(url, tmp_path / "projects", tmp_path, env)
    assert library_references(project) == {f"{library_url(url)}@{first}#subdirectory=lightning-kit"}
    assert state(project)["template"] == template.as_uri()
    commit(project, "bake", env)
    second = change_template(template, env, title=False)

    update = cruft("update", "--skip-apply-ask", project=project, env=env)
    assert update.returncode == 0, update.stdout + update.stderr
    assert library_references(project) == {f"{library_url(url)}@{second}#subdirectory=lightning-kit"}
    assert state(project)["commit"] == second


# Commit B of the template changes the library, and gives the project a test that needs the change.
LIBRARY_CHANGE = (
    "lightning-kit/src/lightning_kit/release_notes.py",
    '"""What this release of the library changed."""\n\nCHANGES = ("the second commit",)\n',
)
PROJECT_TEST = (
    f"{PROJECT_TEMPLATE}/tests/test_release_notes.py",
    "from lightning_kit.release_notes import CHANGES\n\n\n"
    "def test_the_library_is_the_templates_second_commit():\n"
    '    assert CHANGES == ("the second commit",)\n',
)


def library_url(url: str) -> str:
    """The git URL a bake writes for the library's repository: a local one with its host written out (pip 23.2, which
    Python ships, refuses `git+file:///` URLs)."""
    return url.replace("git+file:///", "git+file://localhost/", 1)


@pytest.mark.slow
def test_an_update_to_a_commit_that_changes_the_library_installs_it_there_and_the_project_passes(
    tmp_path, env, fresh_venv: FreshVenv
):
    """Baked from a git URL at commit A and edited, then updated to commit B: the README's one install command puts
    B's library in place (no uninstall), and the project's quick tests pass on it (test_bake.py runs its slow ones).
    Then, in the same environment: a second project at A installed beside it replaces the library, and the first
    says so in one line at start-up; with the library uninstalled, or the project installed with --no-deps, it says
    how to install it in one line."""
    template = tmp_path / "template"
    git("clone", "-q", fresh_venv.template, str(template), cwd=tmp_path, env=env)
    url = f"git+{template.as_uri()}"
    answers = {"task": FRESH_TASK}
    project = cookiecutter_cli(url, tmp_path / "projects", tmp_path, env, answers=answers)
    first = fresh_venv.commit
    assert library_references(project) == {f"{library_url(url)}@{first}#subdirectory=lightning-kit"}
    commit(project, "bake", env)
    edit(project / "README.md", "# Vision Project\n", USER_TITLE)
    commit(project, "our own change", env)
    fresh_venv.pip("install", "-e", ".[dev]", cwd=project)
    assert fresh_venv.distribution("lightning-kit", project)["version"].endswith(f"+g{first[:9]}")
    for name, text in (LIBRARY_CHANGE, PROJECT_TEST):
        (template / name).write_text(text, encoding="utf-8")
    second = commit(template, "the library's release notes", env)

    update = cruft("update", "--skip-apply-ask", project=project, env=env)
    assert update.returncode == 0, update.stdout + update.stderr
    reference = f"{library_url(url)}@{second}#subdirectory=lightning-kit"
    assert library_references(project) == {reference}
    assert (project / "README.md").read_text(encoding="utf-8").startswith(USER_TITLE), "the user's change was lost"
    assert (project / "tests" / "test_release_notes.py").is_file(), "the template's new test did not arrive"
    assert state(project)["commit"] == second

    # Not installed yet: the project's commands say which library they run on, and the command that installs B's.
    stale = fresh_venv.run("python", "train.py", "--help", cwd=project)
    assert stale.returncode == 0, stale.stderr[-4000:]
    warning = stale.stderr.strip().splitlines()[0]
    assert warning.startswith("warning: lightning-kit 0.1."), warning
    assert f"(it is commit {first[:9]}, not {second[:9]})" in warning, warning
    assert warning.endswith(f"pip install 'lightning-kit @ {reference}' installs that one"), warning

    # The README's command, as it is: B's library, whose version is B's own.
    fresh_venv.pip("install", "-e", ".[dev]", cwd=project)
    installed = fresh_venv.distribution("lightning-kit", project)
    assert (installed["direct_url"]["vcs_info"]["commit_id"], installed["direct_url"]["subdirectory"]) == (
        second,
        "lightning-kit",
    ), installed
    assert installed["version"].endswith(f"+g{second[:9]}"), installed
    print(f"the update installed lightning-kit {installed['version']} (was the bake's, at {first[:9]})")
    # Its quick tests, the template's new one among them: its slow ones (short trainings) run in test_bake.py already.
    tests = fresh_venv.run(
        "python", "-m", "pytest", "-v", "-m", "not slow", "-p", "no:cacheprovider", "--disable-warnings", cwd=project
    )
    assert tests.returncode == 0, tests.stdout[-20000:] + tests.stderr[-2000:]
    assert re.search(r"\d+ passed", tests.stdout.splitlines()[-1]), tests.stdout[-2000:]
    assert "tests/test_release_notes.py::test_the_library_is_the_templates_second_commit PASSED" in tests.stdout
    assert "LibraryMismatchWarning" not in tests.stdout and "is installed, but" not in tests.stdout

    # A second project, baked at A, installed into the same environment: pip replaces B's library with A's.
    others = {**answers, "project_name": "Other Project", "project_slug": "other_project"}
    other = cookiecutter_cli(url, tmp_path / "others", tmp_path, env, "--checkout", first, answers=others)
    fresh_venv.pip("install", "-e", ".[dev]", cwd=other)
    assert fresh_venv.distribution("lightning-kit", other)["version"].endswith(f"+g{first[:9]}")
    told = fresh_venv.run("python", "train.py", "--help", cwd=project)
    assert told.returncode == 0 and told.stderr.count("warning: lightning-kit") == 1, told.stderr[-4000:]
    assert f"(it is commit {first[:9]}, not {second[:9]}): pip install 'lightning-kit @ {reference}'" in told.stderr
    assert fresh_venv.run("python", "train.py", "--help", cwd=other).stderr.count("warning:") == 0

    # No library at all: uninstalled, then the project alone installed with --no-deps.
    missing = "error: lightning-kit, the library this project runs on, is not installed here"
    fresh_venv.pip("uninstall", "--yes", "lightning-kit", cwd=project)
    for step in ("uninstalled", "--no-deps"):
        if step == "--no-deps":
            fresh_venv.pip("install", "--no-deps", "-e", ".", cwd=project)
        for command in (("python", "train.py"), ("python", "-m", "vision_project.placement")):
            done = fresh_venv.run(*command, cwd=project)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(missing), (step, done.stderr)
            assert 'pip install -e ".[dev]"' in lines[0], lines
    fresh_venv.pip("install", "-e", ".[dev]", cwd=project)  # as the next test that uses the environment expects
