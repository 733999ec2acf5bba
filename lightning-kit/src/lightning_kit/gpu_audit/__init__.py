"""The device audit: prove on a machine without a GPU that the model will run on one.

The audit trains the model for real, with Lightning's own ``Trainer``, on a simulated
CUDA GPU (the ``simulated`` package): ``fit`` for two short epochs (sanity check,
every hook and callback, backward, optimizer and LR scheduler steps, gradient
clipping, checkpoint saving), then ``validate``, ``test`` and ``predict``. Then it
does it all again as the second process of a two-GPU DDP run, on a second simulated
GPU, where code that assumes GPU 0, and values logged with ``sync_dist=True`` that
are not on the GPU, fail as they would under DDP. Whatever would stop a GPU run
stops the audit at the same operation, reported with the hook, your file and line,
the line that made the tensor on the wrong device, what CUDA would say, and the fix.
It trains the model itself, as Lightning does, and gives it back as it found it
(``restore.py``); to the model's code the simulated GPU is CUDA, so the branch written
for the GPU is the one audited (``simulated/cuda_api.py``).

From the command line (``lightning_kit/placement.py``, beside the library's other commands), with
the same arguments as a project's ``train.py`` (its own command, ``placement.py``, runs that ``main``
with its ``ProjectCLI``), or of any Lightning project by class path (``GenericCLI``):

    python -m <package>.placement --config configs/synthetic.yaml
    python -m lightning_kit.placement --model their.Module --data their.DataModule

Exit status: 0 every stage passed; 1 a placement bug was found; 2 the command line or
configuration is wrong; 3 no bug was found but part of the run could not be audited
(the report says which part and why). A stage the data has nothing for (an image folder
without a ``test/`` split, a data module without a ``test_dataloader``) is skipped, with
a note: the audit covers what the model and the data define.

In tests: ``audit(model, datamodule)`` (or ``audit(model, batch)``) raises
``DevicePlacementError`` for a bug, ``AuditIncompleteError`` when part could not be
audited, and otherwise returns the ``Verdict``; ``audit(..., isolate=True)`` runs it in a
forked copy of the process (where this process's autograd engine has not run yet). It works
whatever ran before it in the process: CPU training, another audit, a failed one.

The same simulated GPU also trains from ``train.py``: ``--accelerator simgpu``.

Its files, bottom to top; each imports only from those below it, and none uses the command line:

- ``simulated/``: the simulated device, the one home of PyTorch's private APIs; nothing of
  Lightning;
- ``verdict.py``: what the audit found (``Verdict``, ``Outcome``, ``DevicePlacementError``,
  ``AuditIncompleteError``) and the exit statuses;
- ``batches.py``: what Lightning's move of a batch left on the CPU (a tensor in a class it cannot move),
  where it sits in the batch, why, and the fix;
- ``explain.py``: the explanation of a failure: the hook, your file and line, the line that
  made the tensor on the wrong device (or the attribute holding it), and the fix from the guide;
- ``lightning.py``: the simulated GPU in Lightning: the ``simgpu`` accelerator, the strategy
  for one GPU or a DDP rank, the hook tracker, the run of ``--accelerator simgpu``;
- ``restore.py``: the model given back as it was found, after each pass trained it;
- ``isolation.py``: the audit in a forked copy of the process, where its death is a verdict
  (``NOT AUDITED ...: the process died with SIGABRT in <hook>``), which the command uses;
- ``audit.py``: the runner, ``audit()`` and ``run_audit()``.

Besides the benchmark's hand-written loop, this package's ``simulated/`` and ``lightning.py`` are the
only places in the library that place tensors by hand (``lint_placement`` exempts them): they play
the part Lightning plays on a real GPU.
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
