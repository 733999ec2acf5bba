"""Every private name of another project that the library relies on, one module per project.

A private name (``LightningCLI._run_subcommand``, ``litserve``'s internals, ``torch.utils._pytree``) carries no
promise between releases. Each module here holds one project's, with the versions it is known to work with, so
that a release that renames one fails a test (``tests/test_upstream.py``, run at the newest versions pinned and at
the lowest declared) instead of silently turning a guarantee off. The simulated GPU's own private names of PyTorch
live with it and are listed there (``gpu_audit/simulated/__init__.py``).
"""

from typing import NamedTuple


class Private(NamedTuple):
    """A private name, reached on the installed version by ``find()``, which returns an instance of ``kind``."""

    name: str
    use: str
    versions: str  # "<project> <lowest> to <highest>", known to work
    find: object  # a function of no argument; it raises where the name is gone, or no longer as the library uses it
    kind: type
