"""lightning_kit: the machinery a Lightning project shares, so that the project holds only its own code (README).

The front door, each name imported when first used (``python -m lightning_kit.runs`` imports no PyTorch): ``audit``
(``lightning_kit.placement``), ``KitCLI``, ``GenericCLI`` and ``main`` (the command line), ``Arguments`` (the
bounded types are in ``lightning_kit.arguments``), ``ConfigError`` and ``UserError``. The commands are
``python -m lightning_kit.placement``, ``.sweep``, ``.runs``, ``.views``, ``.serve``, ``.export``, ``.bench``,
``.lint_placement``, ``.gpu_check`` and ``.guide``. Everything else is reached through its module; names that start
with ``_`` are private.
"""

import importlib
import importlib.metadata
from typing import Any

try:  # the installed distribution's, from git: each commit of the repository is a version of its own
    __version__ = importlib.metadata.version("lightning-kit")
except importlib.metadata.PackageNotFoundError:  # imported from a folder, not installed
    __version__ = "0.1.0"

_PUBLIC = {
    "audit": "lightning_kit.gpu_audit",
    "AuditIncompleteError": "lightning_kit.gpu_audit",
    "DevicePlacementError": "lightning_kit.gpu_audit",
    "Verdict": "lightning_kit.gpu_audit",
    "KitCLI": "lightning_kit.cli",
    "GenericCLI": "lightning_kit.cli",
    "main": "lightning_kit.cli",
    "Arguments": "lightning_kit.arguments",
    "ConfigError": "lightning_kit.errors",
    "UserError": "lightning_kit.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
