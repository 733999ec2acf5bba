"""The device audit: prove on a machine without a GPU that the model will run on one.

The audit trains the model with Lightning's own ``Trainer`` on a simulated CUDA GPU (``simulated/``), every
stage, then again as the second process of a two-GPU DDP run (``audit.py``). Whatever would stop a GPU run stops
the audit at the same operation, reported with the hook, your file and line, the line that made the tensor on the
wrong device, what CUDA would say, and the fix (``explain.py``). Its command is ``lightning_kit/placement.py``; in
tests, ``audit(model, datamodule)`` raises ``DevicePlacementError`` or ``AuditIncompleteError``, or returns the
``Verdict``. ``--accelerator simgpu`` trains on the same simulated GPU (``lightning.py``).

Its files, bottom to top, each importing only from those below it (pyproject.toml's layers): ``simulated/`` (the one
home of PyTorch's private APIs), ``verdict.py``, ``batches.py``, ``explain.py``, ``lightning.py``, ``restore.py``,
``isolation.py``, ``audit.py``. ``simulated/``, ``lightning.py`` and ``batches.py`` play the part
Lightning plays on a real GPU, and are the only ones that place tensors by hand (``lint_placement`` exempts them).
"""

from .audit import audit, run_audit
from .lightning import SIMULATED, SimulatedGPUAccelerator, SimulatedGPUStrategy, run_on_simulated_gpu
from .verdict import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_PASSED,
    EXIT_USAGE,
    AuditIncompleteError,
    DevicePlacementError,
    Outcome,
    Verdict,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_PASSED",
    "EXIT_USAGE",
    "SIMULATED",
    "AuditIncompleteError",
    "DevicePlacementError",
    "Outcome",
    "SimulatedGPUAccelerator",
    "SimulatedGPUStrategy",
    "Verdict",
    "audit",
    "run_audit",
    "run_on_simulated_gpu",
]
