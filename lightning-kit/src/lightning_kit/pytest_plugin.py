"""The pytest plugin: the simulated GPU is set up before the first test, so ``audit()`` works in any test.

PyTorch's autograd engine counts the devices once, at the process's first backward pass; a
session whose first tests train on the CPU could not audit after them. Installed with the
library (the ``pytest11`` entry point), it runs in every pytest session of a project that has
the library; ``-p no:lightning_kit`` turns it off.
"""

import pytest

from .placement import simulated


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    try:
        simulated.enable()
    except simulated.SimulationUnavailableError:
        pass  # audit() says why, in the test that calls it
