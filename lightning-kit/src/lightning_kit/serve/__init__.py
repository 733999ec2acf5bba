"""Serving an exported model over HTTP: ``python -m lightning_kit.serve MODEL`` (see ``command``).

LitServe, the ``serve`` extra, is imported only by the modules that run the server
(``api``, ``inputs``); the model file's checks (``model_file``) need PyTorch alone.
"""

from .model_file import ModelFileError, ModelInfo, read_model

__all__ = ["ModelFileError", "ModelInfo", "read_model"]
