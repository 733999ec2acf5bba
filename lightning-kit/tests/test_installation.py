"""The library installed is the one the project names, said at start-up in one line; a project's pyproject.toml read
as data (``project``), its ``[tool.lightning-kit]`` table the configuration of ``python -m lightning_kit``.

Each comparison is made against what the environment says of the library (``installation.installed``), here set by
the test, and against a pyproject.toml the test writes: the same code reads the real ones at every start-up.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

from lightning_kit import installation, project
from lightning_kit.building import build_all
from lightning_kit.cli import GenericCLI
from lightning_kit.errors import ConfigError
from lightning_kit.installation import Installed

COMMIT_A = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
COMMIT_B = "9f8e7d6c5b4a39281706f5e4d3c2b1a098f7e6d5"
REPOSITORY = "git+https://github.com/org/template"


def write_project(folder: Path, requirement: str | None, table: str = "") -> Path:
    """A project's pyproject.toml in ``folder`` requiring ``requirement`` (none: no requirement of the library)."""
    folder.mkdir(parents=True, exist_ok=True)
    dependencies = [*([f'"{requirement}"'] if requirement else []), '"torch>=2.10"']
    text = f"""\
        [project]
        name = "their-project"
        version = "1.0"
        dependencies = [{", ".join(dependencies)}]
        [project.optional-dependencies]
        serve = ["litserve"]
        """
    (folder / "pyproject.toml").write_text(textwrap.dedent(text) + table, encoding="utf-8")
    return folder / "pyproject.toml"


def at_commit(commit: str, extras: str = "") -> str:
    return f"lightning-kit{extras} @ {REPOSITORY}@{commit}#subdirectory=lightning-kit"


@pytest.mark.parametrize(
    ("requirement", "url", "specifier"),
    [
        (at_commit(COMMIT_A), f"{REPOSITORY}@{COMMIT_A}#subdirectory=lightning-kit", None),
        (at_commit(COMMIT_A, "[serve,onnx]"), f"{REPOSITORY}@{COMMIT_A}#subdirectory=lightning-kit", None),
        ("lightning-kit @ file:///opt/template/lightning-kit", "file:///opt/template/lightning-kit", None),
        ("lightning_kit>=0.1,<0.2", None, ">=0.1,<0.2"),
        ("lightning-kit[serve] >=0.2 ; python_version >= '3.10'", None, ">=0.2"),
        ("lightning-kit", None, None),
    ],
)
def test_the_library_a_project_names_is_read_in_every_form_pep_508_has(tmp_path, requirement, url, specifier):
    found = project.read_project(write_project(tmp_path, requirement))
    assert (found.requirement, found.url, found.specifier) == (requirement, url, specifier)


def test_a_requirement_of_the_library_in_an_extra_only_is_found_and_other_packages_are_not_it(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[project]\nname = "x"\ndependencies = ["lightning-kitchen>=1", "lightning>=2"]\n'
        f'[project.optional-dependencies]\ndev = ["pytest", "{at_commit(COMMIT_B, "[serve]")}"]\n',
        encoding="utf-8",
    )
    assert project.read_project(path).requirement == at_commit(COMMIT_B, "[serve]")


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('packages = "forecaster"', "packages must be a list of module names"),
        ('packages = ["forecaster", "not a module"]', "packages must be a list of module names"),
        ("monitor = 3", "monitor must be the name of a logged metric"),
        ('monitor = "val/mae"\nmode = "lowest"', 'mode must be "min" or "max", got \'lowest\''),
        ('mode = "min"', "give monitor too"),
        ('monitor = "val/mae"', 'monitor needs mode: "min" for a loss or an error, "max" for an accuracy'),
        ('package = ["forecaster"]', "has no setting 'package': it takes mode, monitor, packages"),
    ],
)
def test_a_mistake_in_the_projects_table_is_one_line_naming_the_file_and_the_setting(tmp_path, table, said):
    path = write_project(tmp_path, None, f"[tool.lightning-kit]\n{table}\n")
    with pytest.raises(ConfigError) as caught:
        project.read_project(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: [tool.lightning-kit]") and said in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("content", "said"), [(b"[project\nname = 1", "is not TOML"), (b"\xff\xfe[project]", "is not TOML")]
)
def test_a_pyproject_that_is_not_toml_is_one_line(tmp_path, content, said):
    (tmp_path / "pyproject.toml").write_bytes(content)
    with pytest.raises(ConfigError, match=said):
        project.read_project(tmp_path / "pyproject.toml")
    assert project.find_project(tmp_path) is None  # at start-up, the installation check passes over it


def test_the_project_is_found_from_a_folder_below_it_and_one_planted_in_its_runs_or_data_is_passed_over(tmp_path):
    own = write_project(tmp_path / "proj", at_commit(COMMIT_A))
    for folder in ("src/pkg", "runs/lightning_logs/version_0", "data/photos"):
        (tmp_path / "proj" / folder).mkdir(parents=True)
    assert project.find_project(tmp_path / "proj" / "src" / "pkg").path == own
    # A pyproject.toml in a run or data folder was not written by the project: the project's own is found.
    for folder in ("runs/lightning_logs/version_0", "data/photos", "data"):
        write_project(tmp_path / "proj" / folder, at_commit(COMMIT_B))
        assert project.find_project(tmp_path / "proj" / folder).path == own
    # A project of its own that lives in a folder named data (a mount point) is a project.
    assert project.find_project(write_project(tmp_path / "data" / "other", None).parent).name == "their-project"


@pytest.mark.parametrize(
    ("library", "named", "why"),
    [
        # A git URL at a commit: pip's record of the commit, or the commit in the version setuptools-scm derived.
        (Installed("0.1.1.dev3+g1a2b3c4d5", REPOSITORY.removeprefix("git+"), COMMIT_A), at_commit(COMMIT_A), None),
        (Installed("0.1.1.dev3+g1a2b3c4d5", "file:///home/me/template/lightning-kit", editable=True),
         at_commit(COMMIT_A), None),
        (Installed("0.1.1.dev3+g1a2b3c4d5", REPOSITORY.removeprefix("git+"), COMMIT_A), at_commit(COMMIT_B),
         "it is commit 1a2b3c4d5, not 9f8e7d6c5"),
        (Installed("0.1.0"), at_commit(COMMIT_B), "it is not from a commit of the template's repository"),
        # A folder: installed from that folder (editable, it is the folder as it is now).
        (Installed("0.1.1.dev3+g1a2b3c4d5", "file:///opt/t/lightning-kit", editable=True),
         "lightning-kit @ file:///opt/t/lightning-kit", None),
        (Installed("0.1.1.dev3+g1a2b3c4d5", "file:///opt/other/lightning-kit", editable=True),
         "lightning-kit @ file:///opt/t/lightning-kit", "it was installed from elsewhere"),
        (Installed("0.1.1.dev3+g1a2b3c4d5", REPOSITORY.removeprefix("git+"), COMMIT_A),
         "lightning-kit @ file:///opt/t/lightning-kit", "it was installed from elsewhere"),
        # A version specifier; a bare name; a branch, which cannot be told from here but by its repository.
        (Installed("0.2.3"), "lightning-kit>=0.2,<0.3", None),
        (Installed("0.1.1.dev3+g1a2b3c4d5"), "lightning-kit>=0.2,<0.3", "version 0.1.1.dev3+g1a2b3c4d5 is outside"),
        (Installed("0.3.1.dev1+gabc"), "lightning-kit>=0.3.0", None),  # a development release after 0.3.0
        (Installed("0.0.1"), "lightning-kit", None),
        (Installed("0.1", REPOSITORY.removeprefix("git+"), COMMIT_A), f"lightning-kit @ {REPOSITORY}@main", None),
        (Installed("0.1", "https://github.com/them/fork", COMMIT_A), f"lightning-kit @ {REPOSITORY}@main",
         "it was installed from elsewhere"),
    ],
)  # fmt: skip
def test_the_library_installed_is_held_against_the_one_named(tmp_path, library, named, why):
    found = project.read_project(write_project(tmp_path, named))
    difference = installation.difference(library, found)
    assert difference == why if why is None else difference.startswith(why), difference


def test_a_folder_installed_as_a_copy_that_has_moved_on_since_is_told(tmp_path, monkeypatch):
    """Installed from the folder at one commit (not editable), the folder's repository is at another now."""
    git = tmp_path / "template" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    (git / "refs" / "heads" / "main").write_text(f"{COMMIT_B}\n", encoding="utf-8")
    (tmp_path / "template" / "lightning-kit").mkdir()
    folder = (tmp_path / "template" / "lightning-kit").as_uri()
    named = project.read_project(write_project(tmp_path / "proj", f"lightning-kit @ {folder}"))
    copied = Installed("0.1.1.dev3+g1a2b3c4d5", folder)
    assert installation.difference(copied, named).startswith("it was copied from that folder at commit 1a2b3c4d5")
    # pip reuses the wheel it built of that folder's URL, and counts the copy as the requirement met, unless told.
    monkeypatch.setattr(installation, "installed", lambda: copied)
    line = installation.problem(tmp_path / "proj")
    assert line.endswith(
        f"pip install --force-reinstall --no-deps --no-cache-dir 'lightning-kit @ {folder}' installs that one"
    )
    (git / "refs" / "heads" / "main").write_text(f"{COMMIT_A}\n", encoding="utf-8")
    assert installation.difference(copied, named) is None


def a_template_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A repository whose HEAD names refs/heads/main, with the library's folder in it, and a project naming that
    folder: the repository's .git and the project's file."""
    git = tmp_path / "template" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    (tmp_path / "template" / "lightning-kit").mkdir()
    folder = (tmp_path / "template" / "lightning-kit").as_uri()
    return git, write_project(tmp_path / "proj", f"lightning-kit @ {folder}")


@pytest.mark.parametrize(
    "planted",
    ["a FIFO as HEAD", "HEAD a link to /dev/zero", "a ref outside the repository", "a HEAD of megabytes",
     "a ref that is a FIFO", "a gitdir pointing at a FIFO", "a ref that is not a commit"],
)  # fmt: skip
def test_the_start_up_check_reads_a_repositorys_files_as_data_and_never_waits(tmp_path, planted):
    """What is planted where a repository's files are (a FIFO, a device, a ref outside it, a huge file) tells no
    commit, at once: it never blocks a command's start, nor takes its memory, nor shows another file as a commit.
    In a process of its own: a blocked read would hang only that one (the hang guard)."""
    git, named = a_template_checkout(tmp_path)
    (tmp_path / "outside").write_text(f"{COMMIT_B}\n", encoding="utf-8")
    if planted == "a FIFO as HEAD":
        (git / "HEAD").unlink()
        os.mkfifo(git / "HEAD")
    elif planted == "HEAD a link to /dev/zero":
        (git / "HEAD").unlink()
        (git / "HEAD").symlink_to("/dev/zero")
    elif planted == "a ref outside the repository":
        (git / "HEAD").write_text("ref: ../../outside\n", encoding="utf-8")
    elif planted == "a HEAD of megabytes":
        (git / "HEAD").write_text(COMMIT_B + " " * (8 << 20), encoding="utf-8")
    elif planted == "a ref that is a FIFO":
        os.mkfifo(git / "refs" / "heads" / "main")
    elif planted == "a gitdir pointing at a FIFO":
        shutil.rmtree(git)
        os.mkfifo(tmp_path / "fifo")
        git.write_text(f"gitdir: {tmp_path / 'fifo'}\n", encoding="utf-8")
    else:
        (git / "refs" / "heads" / "main").write_text("../../outside\n", encoding="utf-8")
    script = (
        "import sys; from pathlib import Path; from lightning_kit import installation, project;"
        "named = project.read_project(Path(sys.argv[1]));"
        "copied = installation.Installed('0.1.1.dev3+g1a2b3c4d5', named.url);"
        "print(installation.difference(copied, named))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(named)], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert (run.returncode, run.stdout.strip()) == (0, "None"), run.stderr[-2000:]


def test_a_requirement_is_read_in_one_pass_however_it_is_padded(tmp_path):
    """A pyproject.toml whose requirement a pattern would backtrack on for minutes is read at once (the hang guard
    is the test's only clock), and read right."""
    script = (
        "import sys; from pathlib import Path; from lightning_kit import project;"
        "print(repr(project.read_project(Path(sys.argv[1])).specifier))"
    )
    path = write_project(tmp_path, "lightning-kit" + " " * 600 + ">=0.1" + " " * 600)
    run = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert run.stdout.strip() == "'>=0.1'", run.stderr[-2000:]
    assert project.library_requirement("lightning-kit" + " " * 600 + "@" + " " * 600) is None  # no URL after @


def test_a_requirement_whose_marker_does_not_hold_here_is_not_the_projects(tmp_path):
    """Of two requirements of the library, the one whose environment marker holds in this Python is the one named."""
    other = f"{at_commit(COMMIT_A)} ; python_version < '3.0'"
    here = f"{at_commit(COMMIT_B)} ; python_version >= '3.0'"
    text = f'[project]\nname = "p"\ndependencies = ["{other}", "{here}"]\n'
    (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
    assert project.read_project(tmp_path / "pyproject.toml").requirement == here


def test_a_copy_installed_at_another_tag_is_told(tmp_path):
    named = project.read_project(write_project(tmp_path, f"lightning-kit @ {REPOSITORY}@v0.3.0"))
    at_tag = Installed("0.2.0", REPOSITORY.removeprefix("git+"), COMMIT_A, requested="v0.2.0")
    assert installation.difference(at_tag, named) == "it was installed at v0.2.0, not v0.3.0"
    assert (
        installation.difference(
            Installed("0.3.0", REPOSITORY.removeprefix("git+"), COMMIT_B, requested="v0.3.0"), named
        )
        is None
    )


def test_a_token_in_the_requirements_url_is_never_printed(tmp_path, monkeypatch):
    token = "ghp_0123456789abcdefSECRET"
    requirement = (
        f"lightning-kit @ git+https://me:{token}@github.com/org/template@{COMMIT_B}#subdirectory=lightning-kit"
    )
    write_project(tmp_path, requirement)
    monkeypatch.setattr(
        installation, "installed", lambda: Installed("0.1", "https://github.com/org/template", COMMIT_A)
    )
    line = installation.problem(tmp_path)
    assert line is not None and token not in line and "git+https://***@github.com/org/template@" in line, line


def test_a_difference_is_one_line_saying_what_is_installed_what_is_named_and_the_command(tmp_path, monkeypatch):
    path = write_project(tmp_path, at_commit(COMMIT_B, "[serve]"))
    library = Installed("0.1.1.dev3+g1a2b3c4d5", REPOSITORY.removeprefix("git+"), COMMIT_A)
    monkeypatch.setattr(installation, "installed", lambda: library)
    line = installation.problem(tmp_path)
    assert line == (
        f"lightning-kit 0.1.1.dev3+g1a2b3c4d5 (from {REPOSITORY.removeprefix('git+')}@1a2b3c4d5) is installed, "
        f"but {path} names {at_commit(COMMIT_B, '[serve]')} (it is commit 1a2b3c4d5, not 9f8e7d6c5): "
        f"pip install '{at_commit(COMMIT_B, '[serve]')}' installs that one"
    )
    monkeypatch.setattr(installation, "installed", lambda: Installed("0.1", REPOSITORY.removeprefix("git+"), COMMIT_B))
    assert installation.problem(tmp_path) is None


def test_start_up_says_it_once_for_a_run_and_its_processes_and_never_in_a_ranks_other_processes(
    tmp_path, monkeypatch, capsys
):
    write_project(tmp_path, at_commit(COMMIT_B))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(installation, "installed", lambda: Installed("0.1", REPOSITORY.removeprefix("git+"), COMMIT_A))
    monkeypatch.delenv(installation.CHECKED, raising=False)
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    installation.check_installation()
    installation.check_installation()
    err = capsys.readouterr().err
    assert err.count("warning: lightning-kit 0.1 ") == 1 and len(err.splitlines()) == 1, err
    monkeypatch.delenv(installation.CHECKED)
    monkeypatch.setenv("LOCAL_RANK", "1")
    installation.check_installation()
    assert capsys.readouterr().err == ""


def test_a_library_installed_without_its_requirements_stops_in_one_line(tmp_path, monkeypatch):
    write_project(tmp_path, at_commit(COMMIT_B))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(installation, "missing_requirements", lambda: ["jsonargparse", "lightning"])
    with pytest.raises(SystemExit) as stop:
        installation.check_installation()
    message = str(stop.value.code)
    assert message.startswith("error: lightning-kit is installed without what it needs (jsonargparse, lightning;")
    assert message.endswith(f"pip install '{at_commit(COMMIT_B)}'") and "\n" not in message, message


def test_the_libraries_own_requirements_are_all_installed_here():
    assert installation.missing_requirements() == []
    assert installation.installed() is not None


def test_a_project_without_a_kit_cli_configures_the_generic_command_line_in_its_pyproject(in_tmp_path):
    """``packages`` are trusted like a KitCLI's own package, ``monitor`` and ``mode`` choose the best checkpoint."""
    write_project(in_tmp_path, None, '[tool.lightning-kit]\npackages = ["image_project"]\nmonitor = "val/loss"\n'
                  'mode = "min"\n')  # fmt: skip
    assert GenericCLI.trusted() == ("image_project",) and GenericCLI.own_package() == "image_project"
    assert GenericCLI.monitored() == ("val/loss", "min")
    named = [
        *("--model", "image_project.classifier.Classifier", "--model.num_classes", "10"),
        *("--model.net", "image_project.models.cnn.ReferenceCNN", "--model.net.num_classes", "10"),
        *("--data", "image_project.data.images.ImageDataModule", "--data.dataset", "synthetic"),
    ]
    _, _, trainer = build_all(GenericCLI, named)
    assert (trainer.checkpoint_callback.monitor, trainer.checkpoint_callback.mode) == ("val/loss", "min")
    (in_tmp_path / "pyproject.toml").unlink()
    assert GenericCLI.trusted() == () and GenericCLI.monitored() is None


def test_a_mistake_in_the_table_stops_the_generic_command_line_in_one_line(in_tmp_path, capsys):
    write_project(in_tmp_path, None, '[tool.lightning-kit]\nmonitor = "val/loss"\nmode = "up"\n')
    with pytest.raises(SystemExit) as stop:
        build_all(GenericCLI, ["--model", "x.Y"])
    message = capsys.readouterr().err.strip() or str(stop.value.code)
    assert "pyproject.toml: [tool.lightning-kit] mode must be" in message and "\n" not in message, message


pytest_plugins = ["pytester"]


def test_the_pytest_plugin_warns_of_a_library_that_is_not_the_one_named(pytester, monkeypatch):
    write_project(pytester.path, at_commit(COMMIT_B))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    monkeypatch.setattr(installation, "installed", lambda: Installed("0.1", REPOSITORY.removeprefix("git+"), COMMIT_A))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*lightning-kit 0.1 (from *) is installed, but *pyproject.toml names *installs that*"])


def test_the_pytest_plugins_warning_made_an_error_stops_the_session_in_one_line(pytester, monkeypatch):
    """pytest -W error (or filterwarnings = ["error"]): the session stops with the one line, not INTERNALERROR."""
    write_project(pytester.path, at_commit(COMMIT_B))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    monkeypatch.setattr(installation, "installed", lambda: Installed("0.1", REPOSITORY.removeprefix("git+"), COMMIT_A))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "error")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(
        ["*lightning-kit 0.1 (from *) is installed, but *this session's filters make an error*"]
    )


def test_a_baked_project_without_its_library_says_how_to_install_it_in_one_line(tmp_path):
    """The project's package imports the library's installation check first: without the library (uninstalled, or
    the project installed with --no-deps), its train.py ends in one line, not an ImportError."""
    from conftest import SEQUENCE_PROJECT

    package = SEQUENCE_PROJECT / "src" / "sequence_project"
    # -S: none of the environment's packages (its site-packages), as in one where the library was never installed.
    code = "import sys; sys.path.insert(0, sys.argv[1]); import sequence_project"
    isolated = [sys.executable, "-I", "-S", "-c", code]
    done = subprocess.run(
        [*isolated, str(package.parent)], capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith("error: lightning-kit, the library this project runs on, is not installed here")
    assert 'pip install -e ".[dev]"' in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_version_the_library_says_is_the_installed_distributions():
    """``lightning_kit.__version__`` is what pip installed (a commit of its own), not a number written by hand."""
    import importlib.metadata

    import lightning_kit

    assert lightning_kit.__version__ == importlib.metadata.version("lightning-kit")
