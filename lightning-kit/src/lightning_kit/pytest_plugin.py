"""The pytest plugin: the simulated GPU is set up before the first test, so ``audit()`` works in any test.

The simulated GPU can be set up at any time (its backward passes run on the thread that starts
them, whatever PyTorch's autograd engine counted at the process's first backward pass), so a
session whose first tests train on the CPU audits after them with the plugin and without it
(tests/test_audit.py runs one of each); the plugin sets it up once, before the first test, so that
no test pays for it, and a PyTorch that cannot host it is said in the test that audits. Installed
with the library (the ``pytest11`` entry point), it runs in every pytest session of a project that
has the library; ``-p no:lightning_kit`` turns it off.
"""

import contextlib

import pytest

from .placement import simulated


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    with contextlib.suppress(simulated.SimulationUnavailableError):  # audit() says why, in the test that calls it
        simulated.enable()
