"""Callbacks this project adds to Lightning's, one a module: interruption and resume, divergence, the best
epoch, the predictions CSV, the run's status record, step values logged in short epochs."""

from .best_checkpoint import BestCheckpoint
from .best_epoch import BestEpoch
from .dispatch import skip_empty_batch_hooks
from .divergence import DivergenceError, StopOnDivergence
from .interrupt import InterruptCheckpoint
from .predictions import CSVPredictionWriter
from .random_state import RandomState
from .status import RunStatus
from .step_logging import StepLogging

__all__ = [
    "BestCheckpoint",
    "BestEpoch",
    "CSVPredictionWriter",
    "DivergenceError",
    "InterruptCheckpoint",
    "RandomState",
    "RunStatus",
    "StepLogging",
    "StopOnDivergence",
    "skip_empty_batch_hooks",
]
