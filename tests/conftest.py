from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def template_dir() -> Path:
    """The template's folder, wherever the tests are run from."""
    return TEMPLATE


@pytest.fixture
def bake(cookies, template_dir):
    """Bake the template with some answers changed; return the generated project's folder."""

    def _bake(**answers: str) -> Path:
        result = cookies.bake(extra_context=answers, template=str(template_dir))
        assert result.exit_code == 0, result.exception
        return Path(result.project_path)

    return _bake
