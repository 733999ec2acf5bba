"""The simulated devices: their names, which one is current, and the errors of the simulation."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

DEVICE_TYPE = "simgpu"
DEVICE_COUNT = 2  # a single device, or two DDP processes on one node
_CPU = torch.device("cpu")


class SimulationUnavailableError(RuntimeError):
    """This PyTorch cannot host the simulated device."""


class NotSimulatedError(RuntimeError):
    """An operation the simulated GPU cannot run: ``"the audit cannot run <operation>: <reason>"``.

    PyTorch has it for GPUs only, or the simulated GPU cannot hold or compute its tensors (a layout or
    kind of tensor it has no wrapper for, a failure of its own machinery): what a GPU would make of the
    operation is then unknown, never a pass nor a bug.

    Attributes:
        operation: The operation, e.g. ``"aten._to_copy.default"``.
        reason: Why, in a line.
    """

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"the audit cannot run {operation}: {reason}")
        self.operation = operation
        self.reason = reason


def cannot_run(operation: Any, err: BaseException) -> NotSimulatedError:
    """``NotSimulatedError`` for an exception of the simulated GPU's own machinery while it ran ``operation``."""
    text = str(err).strip()
    reason = f"{type(err).__name__}: {text.splitlines()[0] if text else '(no message)'}"
    made = NotSimulatedError(str(operation), reason)
    made.__cause__ = err
    return made


class SimulatedDeviceError(RuntimeError):
    """What a CUDA GPU would refuse.

    Attributes:
        kind: ``"mixed devices"``, ``"generator"``, ``"hard-coded device"``, ``"numpy"``,
            ``"sync_dist"`` (a collective operation on a tensor off the process's GPU) or ``"host tensor"``
            (a GPU tensor for an argument CUDA reads on the host, such as lengths).
        operation: The operation that refused, e.g. ``"aten.clamp.Tensor"`` or ``"Tensor.numpy"``.
        devices: The devices involved, as CUDA would name them (``"cuda:0"``, ``"cpu"``), the odd one last.
        argument: The name of the operation's argument that is on the odd device, where known.
        culprit: That tensor, where known.
    """

    def __init__(
        self,
        message: str,
        kind: str,
        operation: str,
        devices: tuple[str, ...] = (),
        argument: str | None = None,
        culprit: torch.Tensor | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.operation = operation
        self.devices = devices
        self.argument = argument
        self.culprit = culprit


def as_cuda(device: torch.device | str) -> str:
    """The name CUDA would give the simulated ``device``: ``simgpu:1`` -> ``cuda:1``."""
    return str(device).replace(DEVICE_TYPE, "cuda")


class _State:
    index = 0  # the current device, as torch.cuda.current_device() is for CUDA
    physical: torch.device  # where PyTorch itself sees every simulated tensor: simgpu:0
    is_user_code: Callable[[str], bool] = staticmethod(lambda filename: True)


_state = _State()


def device(index: int = 0) -> torch.device:
    """``simgpu:<index>``."""
    return torch.device(DEVICE_TYPE, index)


def current_device() -> torch.device:
    return torch.device(DEVICE_TYPE, _state.index)


def set_device(device: int | torch.device) -> None:
    """Make ``device`` the current one, as ``torch.cuda.set_device`` does for CUDA."""
    index = device if isinstance(device, int) else torch.device(device).index
    if index is not None:
        if not 0 <= index < DEVICE_COUNT:
            raise ValueError(f"the simulated GPU has devices 0 to {DEVICE_COUNT - 1}, not {index}")
        _state.index = index


# Inside PyTorch every simulated tensor is on simgpu:0 (its autograd engine serves one index
# of a Python device), so where PyTorch's C++ code tells code a device index, the simulated
# GPU's own index is put in its place: the grouping of tensors by device that optimizers'
# and clip_grad_norm_'s foreach paths use, and torch.accelerator's current device.
_GROUP = torch._C._group_tensors_by_device_and_dtype


def _grouped(tensorlistlist, with_indices=False):
    """PyTorch's grouping of tensors by device and dtype, the simulated tensors' group under their own device."""
    return {
        (current_device() if device.type == DEVICE_TYPE else device, dtype): group
        for (device, dtype), group in _GROUP(tensorlistlist, with_indices).items()
    }


def _exchange(index: int) -> int:
    """Make ``index`` the current device (unless negative: none), and return the one before."""
    previous = _state.index
    if index >= 0:
        set_device(index)
    return previous


@contextmanager
def own_indices() -> Iterator[None]:
    """Inside the block, every device index code can observe is the current simulated device's."""
    accelerator = torch.accelerator.current_accelerator()
    is_simulated = accelerator is not None and accelerator.type == DEVICE_TYPE
    replaced = {"_group_tensors_by_device_and_dtype": _grouped}
    if is_simulated:
        replaced["_accelerator_getDeviceIndex"] = lambda: _state.index
        replaced |= dict.fromkeys(
            ("_accelerator_setDeviceIndex", "_accelerator_exchangeDevice", "_accelerator_maybeExchangeDevice"),
            _exchange,
        )
    originals = {name: getattr(torch._C, name) for name in replaced if hasattr(torch._C, name)}
    for name in originals:
        setattr(torch._C, name, replaced[name])
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(torch._C, name, function)
