"""Data module bases a project builds on: in-memory data, cross-validation folds, folders of images.

- ``InMemoryDataModule``: a split held as tensors, batched without a worker process;
- ``fold_split`` and ``FOLD_ARGUMENTS``: stratified, disjoint folds chosen by the seed (``folds``);
- ``ImageFolderDataModule``: a folder per class of your images, decoded once and cached (``folders``),
  with the listing (``image_files``), decoding (``image_decoding``) and on-device augmentation (``augment``).
"""

from .memory import DataUnavailableError, InMemoryDataModule, InMemoryDataset

__all__ = ["DataUnavailableError", "InMemoryDataModule", "InMemoryDataset"]
