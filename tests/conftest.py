from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]


@pytest.fixture
def template() -> str:
    """The template's folder, wherever the tests are run from."""
    return str(TEMPLATE)


@pytest.fixture
def bake(cookies):
    """Bake the template with some answers changed; return the generated project's folder."""

    def _bake(**answers: str) -> Path:
        result = cookies.bake(extra_context=answers, template=str(TEMPLATE))
        assert result.exit_code == 0, result.exception
        return Path(result.project_path)

    return _bake
