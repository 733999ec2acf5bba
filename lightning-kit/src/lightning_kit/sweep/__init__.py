"""Sweeps and cross-validation: many runs of train.py as one Optuna study that survives any stop.

``python -m lightning_kit.sweep``; the command line is in ``command.py``.
"""
