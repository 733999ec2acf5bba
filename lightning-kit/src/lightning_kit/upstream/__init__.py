"""Every private name of another project that the library relies on, one module per project, with the versions
known to work: a release that renames one fails ``tests/test_upstream.py`` instead of silently turning a guarantee
off. (The simulated GPU's private names of PyTorch live with it, in ``gpu_audit/simulated/__init__.py``.)
"""

from typing import NamedTuple


class Private(NamedTuple):
    """A private name, reached on the installed version by ``find()``, which returns an instance of ``kind``."""

    name: str
    use: str
    versions: str  # "<project> <lowest> to <highest>", known to work
    find: object  # a function of no argument; it raises where the name is gone, or no longer as the library uses it
    kind: type
