"""While simulating: what fails in a GPU run because of what the code says, not where its tensors are.

Inside ``simulating()``: ``torch.Generator(device="simgpu")`` works, a CUDA device written
into code (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``, ``.cuda()``) stops with
``SimulatedDeviceError``, and so does ``.numpy()`` of a device tensor.
"""

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .backend import enable
from .devices import _CPU, DEVICE_TYPE, SimulatedDeviceError, _state, as_cuda, current_device, own_indices, set_device
from .tensor import SimulatedTensor

_RealGenerator = torch.Generator


class SimulatedGenerator(_RealGenerator):
    """A random generator of the simulated device: a CPU generator that says it belongs to the device."""

    def __new__(cls, device: torch.device) -> "SimulatedGenerator":
        generator = super().__new__(cls)
        generator._device = device
        return generator

    @property
    def device(self) -> torch.device:
        return self._device


class _GeneratorType(type(_RealGenerator)):
    """``torch.Generator`` while simulating: ``device="simgpu"`` gives a ``SimulatedGenerator``."""

    def __call__(cls, device: Any = "cpu") -> torch.Generator:
        _check_device(device, "torch.Generator")
        if torch.device(device).type == DEVICE_TYPE:
            return SimulatedGenerator(current_device())
        return _RealGenerator(device)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _RealGenerator)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _RealGenerator)


class _Generator(_RealGenerator, metaclass=_GeneratorType):
    pass


_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}
# Pinned memory speeds up copies to a GPU and changes no device: CPU tensors stay as they are.
_PINNING = {
    torch.Tensor.pin_memory: lambda tensor, *args, **kwargs: tensor,
    torch.Tensor.is_pinned: lambda *a, **k: False,
}


class _CodeChecks(TorchFunctionMode):
    """What fails in a GPU run because of what the code says, not where its tensors are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _TO_NUMPY and isinstance(args[0], SimulatedTensor):
            raise SimulatedDeviceError(
                f"can't convert {as_cuda(args[0].device)} device type tensor to numpy. "
                "Use Tensor.cpu() to copy the tensor to host memory first.",
                kind="numpy",
                operation="Tensor.numpy",
                devices=(as_cuda(args[0].device),),
            )
        if func in _PINNING:
            return _PINNING[func](*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if kwargs.get("generator") is not None:
            _check_generator(name, args, kwargs)
        if name == "cuda":
            _check_device(torch.device("cuda", args[1] if len(args) > 1 else None), "Tensor.cuda")
        if "device" in kwargs:
            _check_device(kwargs["device"], name)
        if name == "to":
            for arg in args[1:]:
                _check_device(arg, "Tensor.to")
        return func(*args, **kwargs)


def _check_generator(operation: str, args, kwargs) -> None:
    """A random operation takes a generator of the device it makes its tensor on, as CUDA requires."""
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)
    else:
        device = next((arg.device for arg in tree_flatten(args)[0] if isinstance(arg, torch.Tensor)), _CPU)
    generator = kwargs["generator"]
    if (device.type == DEVICE_TYPE) != isinstance(generator, SimulatedGenerator):
        expected, found = ("cuda", "cpu") if device.type == DEVICE_TYPE else (device.type, "cuda")
        raise SimulatedDeviceError(
            f"Expected a '{expected}' device type for generator but found '{found}'",
            kind="generator",
            operation=operation,
            devices=(as_cuda(device), as_cuda(generator.device)),
        )


def _check_device(device: Any, operation: str) -> None:
    """Stop at a CUDA device written into the code, or at your code's choice of another process's GPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)  # what PyTorch makes of a bare index
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            return
    if not isinstance(device, torch.device):
        return
    if device.type == "cuda":
        raise SimulatedDeviceError(
            f"{operation} was given the device {str(device)!r}, written into the code",
            kind="hard-coded device",
            operation=operation,
            devices=(str(device),),
        )
    if device.type == DEVICE_TYPE and device.index not in (None, _state.index) and _asked_by_user_code():
        raise SimulatedDeviceError(
            f"{operation} was asked for {as_cuda(device)} in the process whose GPU is {as_cuda(current_device())}",
            kind="another GPU",
            operation=operation,
            devices=(as_cuda(current_device()), as_cuda(device)),
        )


_TORCH = str(Path(torch.__file__).resolve().parent)
_SIMULATED = os.path.dirname(__file__) + os.sep  # the simulated GPU's own files, as their code names them


def _asked_by_user_code() -> bool:
    """Whether the innermost caller outside PyTorch (and the simulated GPU) is the user's code, not a library's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH, _SIMULATED)):
        frame = frame.f_back
    return frame is not None and _state.is_user_code(frame.f_code.co_filename)


@contextmanager
def simulating(index: int = 0, is_user_code: Callable[[str], bool] | None = None) -> Iterator[None]:
    """Inside the block: ``simgpu:<index>`` is the current device, with the checks on code described above.

    Args:
        index: The device, 0, or 1 to play the second process of a DDP run.
        is_user_code: Tells the project's files from libraries': a device index chosen in
            library code (PyTorch's own grouping of tensors by device, say) is taken as
            the current device; one chosen in the user's code stops the run.
    """
    enable()
    previous = _state.index, _state.is_user_code
    set_device(index)
    if is_user_code is not None:
        _state.is_user_code = is_user_code
    torch.Generator, torch.compile = _Generator, _as_written
    try:
        # torch.compile cannot trace these tensors: code compiled before runs as written too.
        with torch._dynamo.config.patch(disable=True), _CodeChecks(), own_indices():
            yield
    finally:
        torch.Generator, torch.compile = _RealGenerator, _compile
        _state.index, _state.is_user_code = previous


_compile = torch.compile


def _as_written(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` while simulating: the model or function is returned to run as written."""
    return model if model is not None else _as_written
