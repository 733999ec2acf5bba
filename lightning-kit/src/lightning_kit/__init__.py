"""lightning_kit: the machinery a Lightning project shares, so that the project holds only its own code.

The front door (each name is imported when first used, so that ``python -m lightning_kit.runs``
imports no PyTorch):

- ``audit(model, data)``: train ``model`` on a simulated CUDA GPU and raise ``DevicePlacementError``
  at the line that would fail on a real one (``lightning_kit.placement``);
- ``KitCLI``: the LightningCLI a project subclasses with its classes and defaults, and ``main``,
  which runs it; ``GenericCLI`` takes any ``--model`` and ``--data`` by class path;
- ``lightning_kit.arguments``: bounded types for a class's arguments (``BatchSize``, ``Seed``...), and
  ``Arguments``, the table the Trainer's are checked against;
- the commands: ``python -m lightning_kit.placement``, ``.sweep``, ``.runs``, ``.serve``, ``.export``,
  ``.bench``, ``.lint_placement``, ``.gpu_check``.

Everything else is reached through its module; names that start with ``_`` are private.
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
