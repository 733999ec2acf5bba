"""The simulated devices: their names, which one is current, and the errors of the simulation."""

import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from ...errors import first_line

DEVICE_TYPE = "simgpu"
DEVICE_COUNT = 2  # a single device, or two DDP processes on one node
_CPU = torch.device("cpu")
# The devices as the user's code is told them: the very objects, so that one handed back (``device=x.device``) is
# told from a CUDA device the code names itself.
_CUDA = tuple(torch.device("cuda", index) for index in range(DEVICE_COUNT))
_SIMULATED: list[torch.device] = []  # simgpu:0, simgpu:1: made once the device type is registered (backend.enable)


class SimulationUnavailableError(RuntimeError):
    """This PyTorch cannot host the simulated device."""


class NotSimulatedError(RuntimeError):
    """An operation the simulated GPU cannot run (GPU-only, or tensors it cannot hold): neither a pass nor a bug."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"the audit cannot run {operation}: {reason}")


def cannot_run(operation: Any, err: BaseException) -> NotSimulatedError:
    """``NotSimulatedError`` for an exception of the simulated GPU's own machinery while it ran ``operation``."""
    return NotSimulatedError(str(operation), first_line(err, typed=True))


@dataclass(eq=False, repr=False)
class SimulatedDeviceError(RuntimeError):
    """What a CUDA GPU would refuse, saying ``message``.

    Attributes:
        kind: ``"mixed devices"``, ``"another GPU"``, ``"generator"``, ``"numpy"``, ``"pin memory"``,
            ``"sync_dist"`` (a collective operation on a tensor off the process's GPU), ``"host tensor"``
            (a GPU tensor for an argument CUDA reads on the host, such as lengths) or ``"deterministic"`` (a
            kernel CUDA has no deterministic implementation of, in deterministic mode).
        operation: The operation that refused, e.g. ``"aten.clamp.Tensor"`` or ``"Tensor.numpy"``.
        devices: The devices involved, as CUDA would name them (``"cuda:0"``, ``"cpu"``), the odd one last.
        argument: The name of the operation's argument that is on the odd device, where known.
        culprit: That tensor, where known.
    """

    message: str
    kind: str
    operation: str
    devices: tuple[str, ...] = ()
    argument: str | None = None
    culprit: torch.Tensor | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


def another_gpu(operation: str, index: int) -> SimulatedDeviceError:
    """The error of a DDP process's code that asks for ``cuda:<index>``, another process's GPU."""
    ours, theirs = f"cuda:{_state.index}", f"cuda:{index}"
    return SimulatedDeviceError(
        f"{operation} was asked for {theirs} in the process whose GPU is {ours}: on a GPU what it makes is there, and "
        f"the first operation that meets this process's tensors fails (Expected all tensors to be on the same device, "
        f"but found at least two devices, {ours} and {theirs}!)",
        kind="another GPU",
        operation=operation,
        devices=(ours, theirs),
    )


def as_cuda(device: torch.device | str) -> str:
    """The name CUDA would give the simulated ``device``: ``simgpu:1`` -> ``cuda:1``."""
    return str(device).replace(DEVICE_TYPE, "cuda")


def legacy_type(tensor: torch.Tensor) -> str:
    """The tensor's type as CUDA's messages name it: ``torch.cuda.FloatTensor``, ``torch.FloatTensor``."""
    name = torch.empty(0, dtype=tensor.dtype).type()
    return name if tensor.device.type == "cpu" else name.replace("torch.", "torch.cuda.", 1)


# Code that is never the user's: PyTorch's and the audit's; by default neither is whatever is installed (INSTALLED).
_NEVER_USERS = tuple(
    {
        os.path.join(form, "")  # as code names its file, and resolved
        for folder in (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
        for form in (os.path.abspath(folder), str(Path(folder).resolve()))
    }
)
_AUDIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "audit.py")
_LIBRARIES = {*sysconfig.get_paths().values(), *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))}
INSTALLED = tuple(str(Path(path).resolve()) + os.sep for path in _LIBRARIES if path)


def _not_installed(filename: str) -> bool:
    """The default test of the user's code: a file outside the libraries installed, and not ``<string>``."""
    return not filename.startswith("<") and not str(Path(filename).resolve()).startswith(INSTALLED)


class _State:
    index = 0  # the current device, as torch.cuda.current_device() is for CUDA
    physical: torch.device  # where PyTorch itself sees every simulated tensor: simgpu:0
    is_user_code: Callable[[str], bool] = staticmethod(_not_installed)
    answering = False  # inside simulating(): the user's code is told CUDA's answers
    # Inside simulating(building=True), as before Lightning sets the GPU: a tensor made on it is on GPU 0 (tensor.py).
    building = False
    made_before = False  # whether any tensor was made so
    user_files: dict[str, bool]  # is_user_code of each file asked, while it stays the same


_state = _State()
_state.user_files = {}


def is_users(filename: str) -> bool:
    """Never PyTorch's or the audit's code; else as ``is_user_code`` says."""
    try:
        return _state.user_files[filename]
    except KeyError:
        users = not filename.startswith(_NEVER_USERS) and bool(_state.is_user_code(filename))
        _state.user_files[filename] = users
        return users


def users_line(depth: int = 1, through_libraries: bool = False) -> tuple[str, int] | None:
    """The line of the user's code that called in, from ``depth`` frames up: the innermost frame outside PyTorch and
    the audit, if it is the user's (else None). With ``through_libraries``, the innermost of the user's frames
    (Lightning's collective for ``self.log(..., sync_dist=True)``: the ``self.log`` line)."""
    frame = sys._getframe(depth + 1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == _AUDIT and frame.f_code.co_name == "_stage":
            return None  # the audit's run of a stage: what called it is no part of the run
        if not filename.startswith(_NEVER_USERS):
            if is_users(filename):
                return filename, frame.f_lineno
            if not through_libraries:
                return None
        frame = frame.f_back
    return None


def asked_by_user(depth: int = 1) -> bool:
    """Whether the function ``depth`` frames up (1: the caller's caller) is the user's code, while simulating."""
    return _state.answering and is_users(sys._getframe(depth + 1).f_code.co_filename)


def told(device: torch.device, depth: int = 1) -> torch.device:
    """``device`` as the code ``depth`` frames up is told it: a simulated GPU is CUDA's to the user's code."""
    if device.type == DEVICE_TYPE and asked_by_user(depth + 1):
        return _CUDA[_state.index if device.index is None else device.index]
    return device


def device(index: int = 0) -> torch.device:
    return torch.device(DEVICE_TYPE, index)


def current_device() -> torch.device:
    return _SIMULATED[_state.index]


def cuda_device(index: int | None = None) -> torch.device:
    """``cuda:<index>`` (the current device's where None), as the user's code is told the simulated GPU."""
    return _CUDA[_state.index if index is None else index]


def set_device(device: int | torch.device) -> None:
    """As ``torch.cuda.set_device``."""
    index = device if isinstance(device, int) else torch.device(device).index
    if index is not None:
        if not 0 <= index < DEVICE_COUNT:
            raise ValueError(f"the simulated GPU has devices 0 to {DEVICE_COUNT - 1}, not {index}")
        _state.index = index


# Inside PyTorch every simulated tensor is on simgpu:0, so where PyTorch's C++ code tells a device index, the simulated
# GPU's own is put in its place: the foreach paths' grouping of tensors by device, torch.accelerator's current device.
_GROUP = torch._C._group_tensors_by_device_and_dtype


def _grouped(tensorlistlist, with_indices=False):
    return {
        (current_device() if device.type == DEVICE_TYPE else device, dtype): group
        for (device, dtype), group in _GROUP(tensorlistlist, with_indices).items()
    }


def _exchange(index: int) -> int:
    """Make ``index`` the current device (unless negative), and return the one before."""
    previous = _state.index
    if index >= 0:
        set_device(index)
    return previous


@contextmanager
def own_indices() -> Iterator[None]:
    """Inside the block, every device index code can observe is the current simulated device's."""
    accelerator = torch.accelerator.current_accelerator()
    replaced = {"_group_tensors_by_device_and_dtype": _grouped}
    if accelerator is not None and accelerator.type == DEVICE_TYPE:
        replaced["_accelerator_getDeviceIndex"] = lambda: _state.index
        replaced |= dict.fromkeys(
            ("_accelerator_setDeviceIndex", "_accelerator_exchangeDevice", "_accelerator_maybeExchangeDevice"),
            _exchange,
        )
    with mock.patch.multiple(torch._C, **replaced):
        yield
