"""Sweeps and cross-validation: many runs of train.py as one Optuna study that survives any stop.

``python -m lightning_kit.sweep``; the command line is in ``__main__.py``.
"""

from .space import SearchSpace
from .store import STUDY_DB, STUDY_FILE
from .trial import Plan, run_trial

__all__ = ["STUDY_DB", "STUDY_FILE", "Plan", "SearchSpace", "run_trial"]
