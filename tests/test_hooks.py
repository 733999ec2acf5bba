"""The pre-generation hook rejects bad answers with one clear line, and nothing is left on disk."""

import pytest
from cookiecutter.exceptions import FailedHookException

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
    ({"author_email": "not-an-email"}, "author_email 'not-an-email' is not an email address"),
    ({"author_email": "two@@example.com"}, "author_email 'two@@example.com' is not an email address"),
    ({"version": "one"}, "version 'one' is not a PEP 440 version"),
]


@pytest.mark.parametrize(("answers", "message"), REJECTED, ids=[message.split(" is ")[0] for _, message in REJECTED])
def test_bad_answers_are_rejected_before_anything_is_written(cookies, template_dir, capfd, tmp_path, answers, message):
    result = cookies.bake(extra_context=answers, template=str(template_dir))
    assert result.exit_code != 0
    assert isinstance(result.exception, FailedHookException)
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {message}"), errors
    output_dir = tmp_path / "cookies" / "bake00"
    assert output_dir.is_dir() and not any(output_dir.iterdir())


def test_answers_that_look_like_code_are_never_run(bake, tmp_path):
    """A name built to break out of a string literal in the hooks is stored as text and runs nothing."""
    marker = tmp_path / "executed"
    name = f'x"""; import pathlib; pathlib.Path({str(marker)!r}).touch(); """ \''
    root = bake(project_name=name, project_slug="safe_name")
    assert not marker.exists()
    assert name in (root / "README.md").read_text(encoding="utf-8")
