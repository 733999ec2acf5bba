from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]

# Every wall-clock limit in these tests (`from conftest import HANG_GUARD_S`) guards against a
# hang and judges no speed: a busy machine makes the tests slower, never wrong. The slowest single
# wait, a baked project's whole suite with its slow tests, takes under 5 minutes on 2 idle cores (all
# of `make test` took 295 s), 13.5 minutes on 2 cores shared with other test runs, and 38 minutes
# with two CPU-bound processes added (6 minutes of CPU time each time). Two hours is an order of
# magnitude above an idle run and three times the slowest seen: only a process that has stopped
# making progress trips it.
HANG_GUARD_S = 2 * 60 * 60


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
