"""Callbacks this project adds to Lightning's, one concern a module: interruption and resume, divergence, reporting,
the run's status record."""

from .dispatch import skip_empty_batch_hooks
from .divergence import DivergenceError, StopOnDivergence
from .reporting import BestEpoch, CSVPredictionWriter, RunPlots
from .resume import BestCheckpoint, InterruptCheckpoint, RandomState
from .status import RunStatus

__all__ = [
    "BestCheckpoint",
    "BestEpoch",
    "CSVPredictionWriter",
    "DivergenceError",
    "InterruptCheckpoint",
    "RandomState",
    "RunPlots",
    "RunStatus",
    "StopOnDivergence",
    "skip_empty_batch_hooks",
]
