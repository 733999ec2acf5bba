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
import torch.optim.optimizer
import torch.utils._foreach_utils
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import BackwardHook

from . import lazy
from .backend import enable
from .containment import _kept, discard, in_backward, keep, raise_kept
from .devices import _CPU, DEVICE_TYPE, SimulatedDeviceError, _state, as_cuda, current_device, own_indices, set_device
from .hooks import _APPLY, _apply_checked, _BackwardHookInit, _contained_hook, _module_backward_hooks
from .lazy import is_lazy
from .tensor import SimulatedTensor, to_cpu

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
        if _kept:
            raise_kept()  # back in Python after a backward pass that kept one
        # Every call of a torch function comes here: most ask for nothing these checks look at.
        if (not kwargs or ("device" not in kwargs and "generator" not in kwargs)) and _ordinary(func):
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(self, func, args, kwargs)
        if func in _PINNING:
            return _PINNING[func](*args, **kwargs)
        return _checked(func, args, kwargs)


# {function: whether calls of it are checked by their device= and generator= arguments alone}
_ORDINARY: dict[Any, bool] = {}


def _ordinary(func) -> bool:
    """Whether ``func`` is none of those this mode handles, nor checked by its name (``.to``, ``.cuda``)."""
    try:
        return _ORDINARY[func]
    except KeyError:
        ordinary = _ORDINARY[func] = not (
            func in _HANDLERS or func in _PINNING or func in _TO_NUMPY or getattr(func, "__name__", None) in _NAMED
        )
        return ordinary
    except TypeError:  # a function that cannot be hashed: checked as any other
        return False


_NAMED = ("cuda", "to")  # the names _check looks for


def _checked(func, args, kwargs):
    """``func(*args, **kwargs)``, where the code asks for nothing a GPU run refuses."""
    try:
        _check(func, args, kwargs)
    except SimulatedDeviceError as err:
        if not in_backward():
            raise
        # In a hook the autograd engine runs: kept, and raised when the backward pass returns.
        keep(err)
        func, args, kwargs = _as_on_the_gpu(func, args, kwargs)
    if _state.index != 0:
        args, kwargs = _as_physical(args, kwargs)
    return func(*args, **kwargs)


def _check(func, args, kwargs) -> None:
    """Raise ``SimulatedDeviceError`` where the code asks for what a GPU run refuses."""
    if func in _TO_NUMPY and isinstance(args[0], SimulatedTensor):
        raise SimulatedDeviceError(
            f"can't convert {as_cuda(args[0].device)} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first.",
            kind="numpy",
            operation="Tensor.numpy",
            devices=(as_cuda(args[0].device),),
        )
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


def _as_on_the_gpu(func, args, kwargs):
    """What a refused call computes where it ran on the GPU: the values are on the CPU inside, and CUDA is the
    simulated GPU (so that a hook goes on until the backward pass returns)."""
    if func in _TO_NUMPY:
        return func, (to_cpu(args[0]), *args[1:]), kwargs
    if getattr(func, "__name__", None) == "cuda":
        return torch.Tensor.to, (args[0], current_device()), {}

    def simulated(value):
        if isinstance(value, str | torch.device) and "cuda" in str(value):
            return current_device()
        return value

    return func, tuple(simulated(arg) for arg in args), {name: simulated(value) for name, value in kwargs.items()}


# The autograd engine's check of root gradients (engine.cpp, validate_outputs): a gradient given for an
# output on another device is refused, unless it is 0-dim, which is moved. PyTorch skips the check for
# tensor subclasses (the simulated GPU's tensors are one), so it is made here, before the engine runs.
def _root_gradients(func, args, kwargs):
    """The outputs, the gradients given for them and the argument's name, of a call that starts a backward pass."""
    if func is torch.Tensor.backward:
        outputs, grads, name = args[0], args[1] if len(args) > 1 else kwargs.get("gradient"), "gradient"
    elif func is torch.autograd.backward:
        outputs, grads, name = args[0] if args else kwargs.get("tensors"), kwargs.get("grad_tensors"), "grad_tensors"
        grads = args[1] if len(args) > 1 else grads
    else:  # torch.autograd.grad
        outputs, grads, name = args[0] if args else kwargs.get("outputs"), kwargs.get("grad_outputs"), "grad_outputs"
        grads = args[2] if len(args) > 2 else grads
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    grads = (grads,) if isinstance(grads, torch.Tensor) else () if grads is None else tuple(grads)
    return outputs, grads, name


def _check_root_gradients(func, args, kwargs) -> None:
    outputs, grads, argument = _root_gradients(func, args, kwargs)
    for index, (output, grad) in enumerate(zip(outputs, grads, strict=False)):
        if not isinstance(output, torch.Tensor) or not isinstance(grad, torch.Tensor) or grad.dim() == 0:
            continue
        if grad.device != output.device:
            expected, got = as_cuda(output.device), as_cuda(grad.device)
            raise SimulatedDeviceError(
                f"invalid gradient at index {index} - expected device {expected} but got {got}",
                kind="root gradient",
                operation=_NAMES[func],
                devices=(expected, got),
                argument=argument,
                culprit=grad,
            )


def _backward(mode, func, args, kwargs):
    """A call that starts a backward pass: its root gradients checked, the pass run with these checks on."""
    try:
        _check_root_gradients(func, args, kwargs)
    except SimulatedDeviceError as err:
        if not in_backward():
            raise
        keep(err)
    try:
        result = func(*args, **kwargs)
    except BaseException:
        raise_kept()  # what stopped the pass, where the engine stopped on it
        raise
    raise_kept()
    return result


_ENGINE_RUN = getattr(torch.autograd, "_engine_run_backward", None)


def _engine_run_checked(*args, **kwargs):
    """The autograd engine's run of a backward pass, with these checks on: the hooks it runs are checked as the
    forward pass is (``backward()`` and ``torch.autograd.grad`` reach it from a handler of this mode, where the
    mode is off)."""
    with _CodeChecks():
        return _ENGINE_RUN(*args, **kwargs)


def _register_hook(mode, func, args, kwargs):
    return func(args[0], _contained_hook(args[1]), *args[2:], **kwargs)


def _moves(mode, func, args, kwargs):
    """``.to()`` and ``.cpu()``: an uninitialised parameter or buffer moves in place (see ``lazy``)."""
    if is_lazy(args[0]):
        _check(func, args, kwargs)
        done = lazy.moved(args[0], args[1:] if func is torch.Tensor.to else ("cpu",), kwargs)
        if done is not None:
            return done
    return _checked(func, args, kwargs)


def _as_physical(args, kwargs):
    """The arguments of a call that names a device, the current device as the one PyTorch sees every simulated tensor
    on (``simgpu:0``, ``_state.physical``). As the second process (``simgpu:1``), ``t.to(device)`` or
    ``torch.as_tensor(t, device=device)`` of a tensor already there would otherwise be a move to another device to
    PyTorch, and a copy: on a GPU it is the tensor itself."""

    def physical(value):
        if isinstance(value, str | torch.device):
            try:
                device = torch.device(value)
            except RuntimeError:
                return value
            if device.type == DEVICE_TYPE and device.index == _state.index:
                return _state.physical
        return value

    return tuple(physical(arg) for arg in args), {name: physical(value) for name, value in kwargs.items()}


_HANDLERS = {
    torch.Tensor.backward: _backward,
    torch.autograd.backward: _backward,
    torch.autograd.grad: _backward,
    torch.Tensor.register_hook: _register_hook,
    torch.Tensor.register_post_accumulate_grad_hook: _register_hook,
    torch.Tensor.to: _moves,
    torch.Tensor.cpu: _moves,
}
_NAMES = {torch.Tensor.backward: "Tensor.backward", torch.autograd.backward: "torch.autograd.backward"}
_NAMES[torch.autograd.grad] = "torch.autograd.grad"


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
    BackwardHook.__init__ = _module_backward_hooks
    torch.autograd.Function.apply = _apply_checked
    if _ENGINE_RUN is not None:
        torch.autograd._engine_run_backward = _engine_run_checked
    discard()  # nothing of an earlier run is raised in this one
    try:
        # torch.compile cannot trace these tensors: code compiled before runs as written too. Backward
        # passes run on this thread (the engine's threads for devices were counted at the process's first
        # backward pass, which may have come before the simulated GPU).
        with (
            torch._dynamo.config.patch(disable=True),
            torch.autograd.set_multithreading_enabled(False),
            _CodeChecks(),
            own_indices(),
            _foreach_paths(),
        ):
            try:
                yield
            except BaseException:
                raise_kept()  # what stopped it, where a backward pass kept it
                raise
            raise_kept()  # one kept in a backward pass that no call of ours saw return
    finally:
        torch.Generator, torch.compile = _RealGenerator, _compile
        BackwardHook.__init__ = _BackwardHookInit
        torch.autograd.Function.apply = _APPLY
        if _ENGINE_RUN is not None:
            torch.autograd._engine_run_backward = _ENGINE_RUN
        _state.index, _state.is_user_code = previous


_compile = torch.compile

# PyTorch's lists of the tensor types whose operations may take its foreach (multi-tensor) kernels: optimizers
# (torch.optim.optimizer) and gradient clipping (torch.utils._foreach_utils). A GPU's tensors are plain tensors
# and take them by default, so a GPU runs Adam, SGD or clip_grad_norm_ as one operation over the list of
# parameters: the simulated GPU's tensors take the same path (PyTorch counts the PrivateUse1 device among
# those with foreach kernels, but no tensor subclass among the types).
_FOREACH_TYPES = [
    types
    for module in ("torch.optim.optimizer", "torch.utils._foreach_utils")
    if isinstance(types := getattr(sys.modules.get(module), "_foreach_supported_types", None), list)
]


@contextmanager
def _foreach_paths() -> Iterator[None]:
    """Inside the block, the simulated GPU's tensors take PyTorch's foreach paths, as a GPU's tensors do."""
    added = [types for types in _FOREACH_TYPES if SimulatedTensor not in types]
    for types in added:
        types.append(SimulatedTensor)
    try:
        yield
    finally:
        for types in added:
            if SimulatedTensor in types:
                types.remove(SimulatedTensor)


def _as_written(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` while simulating: the model or function is returned to run as written."""
    return model if model is not None else _as_written
