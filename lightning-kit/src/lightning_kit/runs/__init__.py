"""The table of runs: ``python -m lightning_kit.runs [FOLDER]`` lists every run below a folder.

``folders.py`` finds and reads run folders as data, ``sweeps.py`` sums up a sweep's folder below the table,
``table.py`` makes and formats the table, and ``command.py`` is the command, which ``__main__.py`` runs.
"""

from .folders import Run, find_folders, read_run
from .table import Table

__all__ = ["Run", "Table", "find_folders", "read_run"]
