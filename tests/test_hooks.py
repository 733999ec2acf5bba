"""The pre-generation hook rejects bad answers with one clear line, and nothing is left on disk."""

import pytest
from conftest import TEMPLATE
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

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
    ({"project_slug": "src"}, "project_slug 'src' would shadow the package of that name"),
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
