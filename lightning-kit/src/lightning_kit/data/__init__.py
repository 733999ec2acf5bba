"""Data module bases a project builds on: in-memory data (``memory``), cross-validation folds (``folds``), folders
of images (``folders``, with ``image_files``, ``image_decoding`` and ``augment``).

Each name here is imported when first used: a server decodes images with ``image_decoding`` without Lightning.
"""

import importlib
from typing import Any

_PUBLIC = {
    "DataUnavailableError": "lightning_kit.errors",
    "InMemoryDataModule": "lightning_kit.data.memory",
    "InMemoryDataset": "lightning_kit.data.memory",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
