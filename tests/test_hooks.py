"""The pre-generation hook rejects bad answers with one clear line, and nothing is left on disk."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import HANG_GUARD_S, TEMPLATE
from cookiecutter.environment import StrictEnvironment
from cookiecutter.exceptions import FailedHookException
from cookiecutter.generate import generate_context
from cookiecutter.main import cookiecutter
from cookiecutter.prompt import prompt_for_config

# A name whose default slug is too long for a package, though the file system would still take the folder.
LONG_NAME = "Contrastive Pretraining For Satellite Images Of Agricultural Fields"

REJECTED = [
    ({"project_slug": "3d_vision"}, "project_slug '3d_vision' is not a valid package name"),
    ({"project_slug": "my-project"}, "project_slug 'my-project' is not a valid package name"),
    ({"project_slug": "MyProject"}, "project_slug 'MyProject' is not a valid package name"),
    ({"project_slug": "café"}, "project_slug 'café' is not a valid package name"),
    ({"project_slug": "class"}, "project_slug 'class' is a Python keyword"),
    ({"project_slug": "match"}, "project_slug 'match' is a Python keyword"),
    ({"project_slug": "torch"}, "project_slug 'torch' would shadow the package of that name"),
    ({"project_slug": "lightning"}, "project_slug 'lightning' would shadow the package of that name"),
    ({"project_slug": "torchmetrics"}, "project_slug 'torchmetrics' would shadow the package of that name"),
    ({"project_slug": "test"}, "project_slug 'test' would shadow the package of that name"),
    ({"project_slug": "random"}, "project_slug 'random' would shadow the package of that name"),
    ({"project_slug": "yaml"}, "project_slug 'yaml' would shadow the package of that name"),
    ({"project_slug": "matplotlib"}, "project_slug 'matplotlib' would shadow the package of that name"),
    ({"project_slug": "typing_extensions"}, "project_slug 'typing_extensions' would shadow the package of that name"),
    ({"project_slug": "annotationlib"}, "project_slug 'annotationlib' would shadow the package of that name"),
    ({"project_slug": "train"}, "project_slug 'train' is the name of the project's own train.py"),
    ({"project_slug": "conftest"}, "project_slug 'conftest' is the name of the project's own tests/conftest.py"),
    ({"project_slug": "test_training"}, "project_slug 'test_training' is the name of the project's own test modules"),
    ({"project_slug": "src"}, "project_slug 'src' is the name of the project's own src/ folder"),
    ({"project_slug": "_private"}, "project_slug '_private' is not a valid package name"),
    ({"project_name": "   ", "project_slug": "fine_name"}, "project_name is empty"),
    ({"project_name": "x" * 201, "project_slug": "fine_name"}, "project_name is 201 characters long: use at most 200"),
    ({"project_slug": "a" * 65}, "project_slug is longer than 64 characters: use at most 64"),
    ({"project_name": LONG_NAME}, "project_slug is longer than 64 characters: use at most 64"),
    ({"project_name": "3D Vision"}, "project_slug '3d_vision' is not a valid package name"),
    ({"author_email": "not-an-email"}, "author_email 'not-an-email' is not an email address"),
    ({"author_email": "two@@example.com"}, "author_email 'two@@example.com' is not an email address"),
    ({"version": "one"}, "version 'one' is not a PEP 440 version"),
]


def test_a_name_too_long_for_a_folder_gets_lines_not_a_traceback(cookies, template_dir, capfd):
    """A 300-character name would make a folder name the file system refuses: the default slug stops short of it."""
    result = cookies.bake(extra_context={"project_name": "x" * 300}, template=str(template_dir))
    assert isinstance(result.exception, FailedHookException)
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert [error.split(" is ")[0] for error in errors] == ["ERROR: project_name", "ERROR: project_slug"]


@pytest.mark.parametrize(("answers", "message"), REJECTED, ids=[message.split(" is ")[0] for _, message in REJECTED])
def test_bad_answers_are_rejected_before_anything_is_written(cookies, template_dir, capfd, tmp_path, answers, message):
    result = cookies.bake(extra_context=answers, template=str(template_dir))
    assert result.exit_code != 0
    assert isinstance(result.exception, FailedHookException)
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {message}"), errors
    output_dir = tmp_path / "cookies" / "bake00"
    assert output_dir.is_dir() and not any(output_dir.iterdir())


def test_a_name_with_nothing_to_make_a_slug_from_is_rejected_in_one_line(template_dir, capfd, tmp_path):
    """With `-f` the empty slug names the output folder itself; the hook refuses before anything is written there."""
    config, output = tmp_path / "config.yaml", tmp_path / "out"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'cookiecutters'}\nreplay_dir: {tmp_path / 'replay'}\n")
    output.mkdir()
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(template_dir),
            no_input=True,
            overwrite_if_exists=True,
            output_dir=str(output),
            extra_context={"project_name": "!!!"},
            config_file=str(config),
        )
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert errors == [
        "ERROR: project_slug is empty: give a project_name with letters or digits, "
        "or a project_slug such as 'vision_project'"
    ]
    assert not any(output.iterdir())


def test_the_longest_accepted_name_and_slug_bake(bake):
    """The limits themselves are accepted: a 200-character name and a 64-character slug."""
    root = bake(project_name="x" * 200, project_slug="a" * 64)
    assert root.name == "a" * 64
    assert (root / "src" / ("a" * 64) / "__init__.py").is_file()
    assert (root / "README.md").read_text(encoding="utf-8").startswith("# " + "x" * 200 + "\n")


def test_answers_that_look_like_code_are_never_run(bake, tmp_path):
    """A name built to break out of a string literal in the hooks is stored as text and runs nothing."""
    marker = tmp_path / "executed"
    name = f'x"""; import pathlib; pathlib.Path({str(marker)!r}).touch(); """ \''
    root = bake(project_name=name, project_slug="safe_name")
    assert not marker.exists()
    assert name in (root / "README.md").read_text(encoding="utf-8")


def _listed(hook: str, name: str) -> set[str]:
    """The paths in the list ``name = [...]`` of a hook's source, as written (``PACKAGE / "data" / "images.py"``)."""
    text = (TEMPLATE / "hooks" / hook).read_text()
    block = text.split(f"{name} = [", 1)[1].split("]", 1)[0]
    return {line.strip().rstrip(",") for line in block.splitlines() if line.strip()}


def test_the_pre_bake_record_covers_every_file_the_post_bake_hook_may_remove():
    """A re-bake restores only what the pre-generation hook recorded: the two lists must not drift apart."""
    removable = _listed("post_gen_project.py", "IMAGE_FILES") | _listed("post_gen_project.py", "SEQUENCE_FILES")
    assert _listed("pre_gen_project.py", "REMOVABLE_FILES") == removable


def rendered_pre_gen_hook(folder: Path) -> ModuleType:
    """The pre-generation hook as cookiecutter renders it for the default answers, imported: nothing of it runs."""
    context = generate_context(context_file=str(TEMPLATE / "cookiecutter.json"))
    context["cookiecutter"] = prompt_for_config(context, no_input=True)
    source = (TEMPLATE / "hooks" / "pre_gen_project.py").read_text(encoding="utf-8")
    path = folder / "pre_gen_project.py"
    path.write_text(StrictEnvironment(context=context).from_string(source).render(**context), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("pre_gen_project", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("task", ["image", "sequence"])
def test_no_module_a_project_imports_is_accepted_as_its_slug(bake, tmp_path, task):
    """Each top-level module a project, its tests and tools import, directly or through a dependency, is refused.

    A package of that name would be imported in the module's place, and the project crash
    on start; so a dependency added to the template fails here until the hook refuses it.
    """
    root = bake(task=task)
    collect = [sys.executable, str(Path(__file__).with_name("imported_modules.py"))]
    done = subprocess.run(
        collect, cwd=root, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert {"train", "conftest", "lightning_kit"} <= set(found["written"])
    installed = {
        "lightning_kit",
        "jsonargparse",
        "lightning",
        "typing_extensions",
        "sympy",
        "fsspec",
        "pre_commit",
        "cruft",
    }
    assert installed <= set(found["installed"]), "the library and what it requires are the project's dependencies too"
    assert {"yaml", "docstring_parser", "test_training"} <= set(found["loaded"])
    hook = rendered_pre_gen_hook(tmp_path)
    accepted = {
        source: sorted(name for name in names if name != root.name and hook.slug_problem(name) is None)
        for source, names in found.items()
    }
    assert accepted == {source: [] for source in found}, (
        f"the pre-generation hook accepts these as project_slug: add them to DEPENDENCY_MODULES: {accepted}"
    )


@pytest.mark.slow
def test_a_slug_named_like_one_of_the_projects_folders_still_imports_its_package(bake):
    """A `data/` folder beside `src/data/` is a namespace portion, which the package wins over: `data` is accepted."""
    root = bake(project_slug="data", task="sequence")
    (root / "data").mkdir()
    (root / "data" / "sequences.npz").write_bytes(b"")
    (root / "runs").mkdir()
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    command = [sys.executable, "train.py", "--help"]
    done = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fit" in done.stdout


def test_without_the_templates_folder_a_link_anywhere_in_the_project_stops_the_bake(tmp_path, monkeypatch):
    """Where the template's folder is unknown (cruft off Linux), any link counts but in .git, data/, runs/ or a venv."""
    hook = tmp_path / "hook"
    hook.mkdir()
    rendered_pre_gen_hook(hook)
    project, outside, records = tmp_path / "project", tmp_path / "outside", tmp_path / "records"
    for folder in (project / ".venv" / "bin", project / "notes", outside / "datasets", records):
        folder.mkdir(parents=True)
    (outside / "README.md").write_text("shared\n")
    (project / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (project / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (project / "data").symlink_to(outside / "datasets")
    monkeypatch.chdir(tmp_path)  # this process starts the hook: its working folder holds no template
    env = {**os.environ, "TMPDIR": str(records)}

    def run_hook() -> subprocess.CompletedProcess:
        command = [sys.executable, str(hook / "pre_gen_project.py")]
        return subprocess.run(
            command,
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=HANG_GUARD_S,
        )

    kept = run_hook()
    assert kept.returncode == 0, kept.stderr
    (project / "notes" / "README.md").symlink_to(outside / "README.md")
    stopped = run_hook()
    assert stopped.returncode == 1
    assert stopped.stderr.splitlines() == [
        f"ERROR: notes/README.md is a symbolic link to {outside / 'README.md'}: a re-bake might write the template's "
        "file into the file it points to; replace the link with a copy of its target, or move it out of the project, "
        "and bake again (the template's folder was not found)"
    ]
