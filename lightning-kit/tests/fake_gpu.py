"""A rule's example run as a GPU run of one step on FakeTensor's CUDA device (``fake_check.py``).

What Lightning would run on a GPU, by hand: the model and the batch moved to the device (its own
``transfer_batch_to_device``), the optimizer configured, a validation step and its epoch end (the
sanity check), a training step, its backward pass (where this machine can run one), the hook before
the optimizer's step, the step, and validation again. No Trainer: FakeTensor's tensors have no
values for one to log or check.
"""

from collections.abc import Callable

import fake_check
import lightning as L
import torch
from fake_check import CANNOT_EXPRESS, FakeVerdict
from lightning.pytorch.utilities.model_helpers import is_overridden
from test_simulated_gpu import BATCH

DDP = "under DDP"


def on_fake_gpu(make: Callable[[], L.LightningModule], *marks: str) -> FakeVerdict:
    """FakeTensor's verdict on one step of ``make()`` on a GPU (a collective under DDP it cannot express)."""
    if DDP in marks:
        return FakeVerdict(CANNOT_EXPRESS, "a collective needs a process group of CUDA devices")
    model = make()

    def run(device: torch.device) -> bool:
        model.to(device)
        batch = model.transfer_batch_to_device(BATCH, device, 0)
        optimizer = _optimizer(model.configure_optimizers())
        _validate(model, batch)
        out = model.training_step(batch, 0)
        if not model.automatic_optimization or out is None:
            return True
        if not fake_check.backward(out["loss"] if isinstance(out, dict) else out):
            return False
        model.on_before_optimizer_step(optimizer)
        optimizer.step()
        _validate(model, batch)
        return True

    return fake_check.on_fake_cuda(run)


def _optimizer(configured) -> torch.optim.Optimizer:
    if isinstance(configured, dict):
        return _optimizer(configured["optimizer"])
    if isinstance(configured, list | tuple):
        return _optimizer(configured[0])
    return configured


def _validate(model: L.LightningModule, batch) -> None:
    if is_overridden("validation_step", model, L.LightningModule):
        model.eval()
        with torch.no_grad():
            model.validation_step(batch, 0)
        model.on_validation_epoch_end()
        model.train()
