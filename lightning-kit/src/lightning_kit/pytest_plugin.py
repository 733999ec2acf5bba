"""The pytest plugin: the simulated GPU is set up before the first test, so ``audit()`` works in any test.

The simulated GPU can be set up at any time (its backward passes run on the thread that starts
them, whatever PyTorch's autograd engine counted at the process's first backward pass), so a
session whose first tests train on the CPU audits after them with the plugin and without it
(tests/test_audit.py runs one of each); the plugin sets it up once, before the first test, so that
no test pays for it, and a PyTorch that cannot host it is said in the test that audits. Installed
with the library (the ``pytest11`` entry point), it runs in every pytest session of a project that
has the library; ``-p no:lightning_kit.pytest_plugin`` turns it off.

It also holds the library installed against the one the project's ``pyproject.toml`` (at pytest's
rootdir) names: a library installed without its own requirements stops the session in one line, and
one that is not the library named is a warning of the session, saying the command that installs it (where the
session makes warnings errors, `-W error`, it stops the session in that one line).
"""

import contextlib

import pytest

from . import installation


class LibraryMismatchWarning(UserWarning):
    """The library installed is not the one the project's pyproject.toml names."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    missing = installation.missing_requirements()
    if missing:
        raise pytest.UsageError(
            f"lightning-kit is installed without what it needs ({', '.join(missing)}; installed with --no-deps?): "
            "install it again without --no-deps"
        )
    found = installation.problem(config.rootpath)
    if found is not None:
        try:
            config.issue_config_time_warning(LibraryMismatchWarning(found), stacklevel=2)
        except LibraryMismatchWarning as err:  # -W error (or filterwarnings = error): the session stops, in one line
            raise pytest.UsageError(f"{found} (a warning, which this session's filters make an error)") from err
    from .gpu_audit import simulated  # PyTorch: imported once the library is known to have it

    with contextlib.suppress(simulated.SimulationUnavailableError):  # audit() says why, in the test that calls it
        simulated.enable()
