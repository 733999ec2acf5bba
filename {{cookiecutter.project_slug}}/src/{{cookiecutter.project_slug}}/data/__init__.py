"""This project's LightningDataModules: where the data comes from, how it is split and batched.

They build on lightning_kit's bases (``lightning_kit.data``: in-memory data, folds, image folders).
"""
