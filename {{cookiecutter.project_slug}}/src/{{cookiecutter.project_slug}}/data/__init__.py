"""LightningDataModules: where data comes from, how it is split and batched.

The shared base is in ``memory``; each source of data has a module of its own.
"""

from lightning_kit.data.memory import DataUnavailableError, InMemoryDataModule, InMemoryDataset

__all__ = ["DataUnavailableError", "InMemoryDataModule", "InMemoryDataset"]
