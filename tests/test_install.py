"""The library reaches projects with pip: a baked project requires it where it was baked from, and a Lightning
project that was never baked (the library's example, ``lightning-kit/examples/forecaster``) installs it from a
path or a git URL and audits its own model with it.

Each test here uses the session's one fresh environment (``fresh_venv`` in conftest.py): a plain virtual environment
with the pip that Python ships, into which a project baked from a git URL was installed as its README says for a
machine without a GPU (PyTorch's CPU build first, then `pip install -e ".[dev]"`), every dependency from the package
index; the tests after it install into it what they need, where the rest is there already: never an uninstall first.
"""

import re
import shutil
from pathlib import Path

import pytest
from conftest import TEMPLATE, FreshVenv, library_requirements

pytestmark = pytest.mark.slow

LIBRARY = "lightning-kit"
EXAMPLE = TEMPLATE / LIBRARY / "examples" / "forecaster"
# How the example names the library: the template's repository, which a user points at their copy.
EXAMPLE_REQUIREMENT = f"{LIBRARY}[serve] @ git+https://github.com/org/template#subdirectory={LIBRARY}"


def test_a_project_baked_from_a_git_url_installs_the_library_from_that_repository_at_that_commit(
    fresh_venv: FreshVenv, tmp_path
):
    project = Path(fresh_venv.project)
    url = (
        f"{fresh_venv.url.replace('git+file:///', 'git+file://localhost/')}@{fresh_venv.commit}#subdirectory={LIBRARY}"
    )
    found = library_requirements(project)
    assert len(found) == 8, found  # the dependency, and the extras dashboard, mlflow, onnx, postgres, serve, wandb, dev
    assert all(text.split(" @ ", 1)[1] == url for text in found), found
    assert found[0] == f"{LIBRARY} @ {url}"

    # What the fresh environment's `pip install -e ".[dev]"`, with the pip Python ships, installed: the library
    # cloned from the template's repository, checked out at the commit baked, built from its folder there.
    library = fresh_venv.installed[LIBRARY]
    direct = library["direct_url"]
    assert (direct["url"], direct["vcs_info"]["vcs"]) == (url.removeprefix("git+").partition("@")[0], "git"), library
    assert (direct["vcs_info"]["commit_id"], direct["subdirectory"]) == (fresh_venv.commit, LIBRARY), library
    assert library["version"].endswith(f"+g{fresh_venv.commit[:9]}"), library  # the commit is in its version
    assert Path(library["location"]).resolve().is_relative_to(Path(fresh_venv.folder).resolve()), library
    assert fresh_venv.installed["vision_project"]["direct_url"] == {
        "url": project.as_uri(),
        "dir_info": {"editable": True},
    }
    # The CPU build of PyTorch installed first is kept: none of CUDA's libraries were installed beside it.
    torch = fresh_venv.installed["torch"]
    if fresh_venv.cpu_torch is None:
        pytest.fail("no CPU build of PyTorch in pip's --find-links folders: the CPU path of the README is untested")
    assert torch["version"] == fresh_venv.cpu_torch and torch["direct_url"] is None, torch
    listed = fresh_venv.pip("list", "--format", "freeze", cwd=project)
    assert not re.search(r"^nvidia-", listed, flags=re.MULTILINE | re.IGNORECASE), listed
    print(f"fresh environment (CPU PyTorch {fresh_venv.cpu_torch}, then `pip install -e .[dev]`): "
          f"{fresh_venv.install_seconds} s")  # fmt: skip

    # The same command again changes nothing, and the project's commands run on what it installed: the audit. (On
    # the library the build installed: the session's other tests install theirs, and run in any order.)
    fresh_venv.library_as_built()
    fresh_venv.pip("install", "-e", ".[dev]", cwd=project)
    assert fresh_venv.distribution(LIBRARY, project)["direct_url"] == library["direct_url"]
    audit = fresh_venv.run(
        *("python", "-m", "vision_project.placement", "--config", "configs/synthetic.yaml"),
        *("--data.num_sequences", "200"),
        cwd=project,
    )
    assert audit.returncode == 0, audit.stdout[-6000:] + audit.stderr[-4000:]
    assert "the model will run on a GPU" in audit.stdout, audit.stdout
    assert "warning:" not in audit.stderr, audit.stderr


def their_project(folder: Path, library: str) -> Path:
    """A copy of the library's example, its pyproject.toml naming ``library`` (as a user points it at their copy)."""
    project = shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("runs", "__pycache__", "*.egg-info"))
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    assert text.count(EXAMPLE_REQUIREMENT) == 1, "the example names the library as the README says"
    pyproject.write_text(text.replace(EXAMPLE_REQUIREMENT, library), encoding="utf-8")
    return project


def their_pytest(venv: FreshVenv, project: Path):
    """The example's own tests, in which the library's pytest plugin (installed with it) sets up the simulated GPU."""
    tests = venv.run("python", "-m", "pytest", "-p", "no:cacheprovider", cwd=project)
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr[-2000:]
    assert re.search(r"^2 passed", tests.stdout.splitlines()[-1].strip("= ")), tests.stdout[-2000:]
    assert re.search(r"^plugins: .*\blightning-kit-", tests.stdout, flags=re.MULTILINE), tests.stdout[:2000]
    assert "is installed, but" not in tests.stdout, tests.stdout[-4000:]


def test_a_project_never_baked_installs_the_library_from_a_path_and_audits_its_own_model(fresh_venv, tmp_path):
    """From the command line, and in its own pytest session after training on the CPU."""
    library = Path(fresh_venv.template) / LIBRARY
    project = their_project(tmp_path / "forecaster", f"{LIBRARY}[serve] @ {library.as_uri()}")
    fresh_venv.pip("install", "-e", ".[test]", cwd=project)
    installed = fresh_venv.distribution(LIBRARY, project)
    assert installed["direct_url"] == {"url": library.as_uri(), "dir_info": {}}, installed

    audited = fresh_venv.run("python", "-m", "lightning_kit.placement", "--config", "configs/forecaster.yaml",
                             cwd=project)  # fmt: skip
    assert audited.returncode == 0, audited.stdout[-4000:] + audited.stderr[-4000:]
    assert "the model will run on a GPU" in audited.stdout and audited.stderr.count("Traceback") == 0, audited.stdout
    wrong = fresh_venv.run("python", "-m", "lightning_kit.placement", "--model", "forecaster.Forecastr", cwd=project)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr[-4000:]
    assert "--model" in wrong.stderr and "Traceback" not in wrong.stderr, wrong.stderr
    their_pytest(fresh_venv, project)


def test_a_project_never_baked_installs_the_library_from_the_templates_git_url(fresh_venv, tmp_path):
    """The template's repository, a commit and the library's folder in it: `git+URL@COMMIT#subdirectory=...`; the
    library installed is that commit's, whether pip took it from there or kept an install of the same commit."""
    url = f"{fresh_venv.url.replace('git+file:///', 'git+file://localhost/')}@{fresh_venv.commit}"
    project = their_project(tmp_path / "forecaster", f"{LIBRARY}[serve] @ {url}#subdirectory={LIBRARY}")
    fresh_venv.pip("install", "-e", ".[test]", cwd=project)
    installed = fresh_venv.distribution(LIBRARY, project)
    assert installed["version"].endswith(f"+g{fresh_venv.commit[:9]}"), installed
    their_pytest(fresh_venv, project)
