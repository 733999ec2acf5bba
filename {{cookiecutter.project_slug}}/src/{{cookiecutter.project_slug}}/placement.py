"""The device audit: prove on a machine without a GPU that a model will run on one.

``audit(model, batch)`` moves a copy of a LightningModule and a batch to a
*simulated* CUDA device, the way Lightning would move them to a real one, and runs
the model's steps there. The simulation is PyTorch's ``FakeTensorMode``: tensors
carry shapes, dtypes and devices but no data, and an operation that mixes devices
fails exactly as it would on a GPU, with the same "Expected all tensors to be on
the same device" error. The audit turns that into a ``DevicePlacementError`` that
names the operation and the line of your code where it happened.

Run it on the configured model and data from the command line:

    python -m {{ cookiecutter.project_slug }}.placement --config configs/synthetic.yaml

This module is the one place in the project that moves tensors by hand: it plays
the part Lightning plays in training.
"""

import copy
import re
import sys
import sysconfig
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import lightning_fabric
import torch
import torchmetrics
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch._subclasses.fake_tensor import FakeTensorMode

SIMULATED_DEVICE = torch.device("cuda", 0)
STEPS = ("training_step", "validation_step", "test_step", "predict_step")
BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
# Frames in these packages are library code; the audit reports the innermost frame outside them.
_LIBRARY_DIRS = (
    *(str(Path(module.__file__).resolve().parent) for module in (torch, L, lightning_fabric, torchmetrics)),
    str(Path(__file__).resolve()),
)
_STDLIB_DIR = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
# PyTorch's error, its older wording for fake tensors, and torchmetrics' wrapper of it.
_MIXED_DEVICES = re.compile(
    "Expected all tensors to be on the same device|found two different devices|Encountered different devices"
)


class DevicePlacementError(RuntimeError):
    """An operation mixed tensors on different devices: the model would fail on a GPU.

    Attributes:
        step: The LightningModule method that was running (``"training_step"``, ...).
        operation: The PyTorch operation that received the mixed devices, e.g. ``"aten.add.Tensor"``.
        filename: The file of the line in your code where it happened.
        lineno: That line's number.
    """

    def __init__(self, message: str, step: str, operation: str, filename: str, lineno: int) -> None:
        super().__init__(message)
        self.step = step
        self.operation = operation
        self.filename = filename
        self.lineno = lineno


def audit(model: L.LightningModule, batch: Any, datamodule: L.LightningDataModule | None = None) -> dict[str, float]:
    """Run ``model``'s steps on a simulated CUDA device; raise ``DevicePlacementError`` if any mixes devices.

    The audit works on a copy: ``model``, its device and the global state of
    PyTorch (default device, deterministic mode, random generator) are left as
    they were. It runs each of ``training_step``, ``validation_step``,
    ``test_step`` and ``predict_step`` that the model defines, forward only: the
    loss and metric updates are covered, the backward pass is not (the autograd
    engine cannot run on simulated devices). Lightning's batch-transfer hooks run
    as in training, those of ``datamodule`` taking precedence where it defines them.

    Args:
        model: The LightningModule, as constructed (on the CPU, not yet trained or attached).
        batch: A batch as the DataLoader yields it, on the CPU.
        datamodule: The DataModule whose batch-transfer hooks apply, if any.

    Returns:
        The steps audited, each with its seconds.
    """
    steps = [step for step in STEPS if is_overridden(step, model, L.LightningModule)]
    # Copy outside the fake mode, without the Trainer a used model may hold.
    twin = copy.deepcopy(model, memo={id(model._trainer): None} if model._trainer is not None else None)
    timings = {}
    with simulated_gpu():
        twin = twin.to(SIMULATED_DEVICE)
        for step in steps:
            start = time.perf_counter()
            twin.train(step == "training_step")
            with torch.set_grad_enabled(step == "training_step"), _reporting(step):
                on_device = _transfer(batch, model=twin, datamodule=datamodule)
                getattr(twin, step)(on_device, 0)
            timings[step] = time.perf_counter() - start
    return timings


def run_on_simulated_gpu(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function`` with its tensor arguments on the simulated CUDA device.

    For code outside a LightningModule, such as a data module's on-device
    augmentation. Returns the result, made of simulated tensors (shapes, dtypes
    and devices, no values).
    """
    with simulated_gpu(), _reporting(getattr(function, "__qualname__", repr(function))):
        args, kwargs = move_data_to_device((args, kwargs), SIMULATED_DEVICE)
        return function(*args, **kwargs)


@contextmanager
def simulated_gpu() -> Iterator[None]:
    """Simulate a CUDA device inside the ``with`` block, and restore PyTorch's global state after it."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    rng_state = torch.get_rng_state()
    try:
        # Deterministic mode sends torchmetrics' bincount down its static-shape path,
        # which a simulated tensor can follow (it has no values to count).
        torch.use_deterministic_algorithms(True)
        with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True):
            # Steps run without a Trainer here, so self.log() has nowhere to log to.
            warnings.filterwarnings("ignore", message=r"You are trying to `self.log\(\)`")
            yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_rng_state(rng_state)


def _transfer(batch: Any, model: L.LightningModule, datamodule: L.LightningDataModule | None) -> Any:
    """Move ``batch`` as Lightning does: the three batch-transfer hooks, the data module's first."""
    for hook in BATCH_HOOKS:
        owner = datamodule if datamodule is not None and is_overridden(hook, datamodule) else model
        args = (batch, SIMULATED_DEVICE, 0) if hook == "transfer_batch_to_device" else (batch, 0)
        batch = getattr(owner, hook)(*args)
    return batch


@contextmanager
def _reporting(step: str) -> Iterator[None]:
    """Turn a mixed-device error into a DevicePlacementError naming the operation and the user's line."""
    try:
        yield
    except RuntimeError as err:
        if not _MIXED_DEVICES.search(str(err)):
            raise
        frame = _user_frame(err)
        operation = _operation(err)
        raise DevicePlacementError(
            f"{step}: {operation} mixed devices at {frame.filename}:{frame.lineno}\n"
            f"    {frame.line}\n"
            f"{err}\n"
            "On a GPU this is the error `Expected all tensors to be on the same device`. "
            "See docs/device-placement.md for the rules and their fixes.",
            step=step,
            operation=operation,
            filename=frame.filename,
            lineno=frame.lineno,
        ) from None


def _operation(err: BaseException | None) -> str:
    """The PyTorch operation named by the error or the errors it wraps."""
    while err is not None:
        if getattr(err, "func", None) is not None:
            return str(err.func)
        err = err.__cause__ or err.__context__
    return "an operation"


def _user_frame(err: BaseException) -> traceback.FrameSummary:
    """The innermost frame of the traceback that is not PyTorch, Lightning, torchmetrics or the standard library."""
    frames = traceback.extract_tb(err.__traceback__)
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        in_stdlib = path.startswith(_STDLIB_DIR) and "-packages" not in path
        if not (in_stdlib or path.startswith(_LIBRARY_DIRS)):
            return frame
    return frames[-1]


def main(args: list[str] | None = None) -> None:
    """Audit the model and data that ``train.py`` would build from the same arguments, and report."""
    from .cli import build

    model, datamodule = build(sys.argv[1:] if args is None else args)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    print(f"Auditing {type(model.net).__name__} in {type(model).__name__} on a simulated {SIMULATED_DEVICE} ...")
    try:
        timings = audit(model, batch, datamodule=datamodule)
    except DevicePlacementError as err:
        sys.exit(f"FAILED {err}")
    for step, seconds in timings.items():
        print(f"  {step:<16} ok  ({seconds:.2f} s)")
    print("Every step keeps its tensors on one device: the model will run on a GPU.")


if __name__ == "__main__":
    main()
