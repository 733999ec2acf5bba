"""The device audit: prove on a machine without a GPU that the model will run on one.

The audit trains the model with Lightning's own ``Trainer`` on a simulated CUDA GPU (``simulated/``), every stage,
alone and as each process of a two-GPU DDP run (``audit.py``), and stops where a GPU would, with the hook, the line,
what CUDA would say and the fix (``explain.py``). ``--accelerator simgpu`` trains on the same GPU (``lightning.py``).

Layers, bottom to top (pyproject.toml): ``simulated/`` (the one home of PyTorch's private APIs), ``verdict.py``,
``batches.py``, ``explain.py``, ``lightning.py``, ``restore.py``, ``isolation.py``, ``audit.py``. ``simulated/``,
``lightning.py`` and ``batches.py`` are the only ones that place tensors by hand (``lint_placement`` exempts them).
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
