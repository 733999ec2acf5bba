"""Serving an exported model over HTTP: ``python -m lightning_kit.serve MODEL`` (``command``). LitServe, the ``serve``
extra, is imported only by the modules that run the server (``api``, ``inputs``)."""

from .model_file import ModelFileError, ModelInfo, read_model

__all__ = ["ModelFileError", "ModelInfo", "read_model"]
