"""The pytest plugin (the ``pytest11`` entry point; ``-p no:lightning_kit.pytest_plugin`` turns it off), in every
pytest session of a project that has the library: the simulated GPU is set up once, before the first test, so that no
test pays for it (``audit()`` works in any test without it too), and a PyTorch that cannot host it is said in the test
that audits. It also holds the library installed against the one the project's ``pyproject.toml`` (at pytest's rootdir)
names, as ``installation`` does at a command's start: a warning of the session (an error under ``-W error``).
"""

import contextlib

import pytest

from . import installation


class LibraryMismatchWarning(UserWarning):
    """The library installed is not the one the project's pyproject.toml names."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    missing = installation.missing_line(installation.find_project(config.rootpath))
    if missing is not None:
        raise pytest.UsageError(missing)
    found = installation.problem(config.rootpath)
    if found is not None:
        try:
            config.issue_config_time_warning(LibraryMismatchWarning(found), stacklevel=2)
        except LibraryMismatchWarning as err:  # -W error (or filterwarnings = error): the session stops, in one line
            raise pytest.UsageError(f"{found} (a warning, which this session's filters make an error)") from err
    from .gpu_audit import simulated  # PyTorch: imported once the library is known to have it

    with contextlib.suppress(simulated.SimulationUnavailableError):  # audit() says why, in the test that calls it
        simulated.enable()
