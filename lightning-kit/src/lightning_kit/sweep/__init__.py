"""Sweeps and cross-validation: many runs of train.py as one Optuna study that survives any stop.

``python -m lightning_kit.sweep``; the command line is in ``__main__.py``.
"""

from .space import SearchSpace
from .trial import Plan, run_trial

__all__ = ["Plan", "SearchSpace", "run_trial"]
