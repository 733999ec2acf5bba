"""The table of runs: ``python -m lightning_kit.runs [FOLDER]`` lists every run below a folder.

``folders.py`` finds and reads run folders as data, ``sweeps.py`` reads a sweep's study,
``table.py`` makes and formats the table, and ``command.py`` is the command
(``main(args=None, prog=None)``), which ``__main__.py`` runs.
"""

from .folders import Run, find_folders, read_run
from .sweeps import Sweep, read_sweep
from .table import Table

__all__ = ["Run", "Sweep", "Table", "find_folders", "read_run", "read_sweep"]
