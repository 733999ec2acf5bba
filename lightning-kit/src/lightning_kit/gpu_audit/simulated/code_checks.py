"""While simulating: what fails in a GPU run because of what the code says, not where its tensors are.

A CUDA device the code names (``"cuda"``, ``"cuda:1"``, ``.cuda()``, a bare index) is the simulated GPU of that
index, and another process's GPU stops with ``SimulatedDeviceError``; so does ``.numpy()`` of a device tensor.
Each line of the user's code that names CUDA itself is kept (``named_cuda``): it runs on a GPU, but not with
``--accelerator cpu`` on a machine that has one.
"""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
import torch._dynamo
import torch.optim.optimizer
import torch.utils._foreach_utils
from torch.nn.parameter import is_lazy
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import BackwardHook

from . import cuda_api, in_place, lazy
from .backend import enable
from .containment import _kept, discard, in_backward, keep, raise_kept
from .deterministic import _forward_lines, _warned
from .devices import (
    _CPU,
    _CUDA,
    DEVICE_TYPE,
    SimulatedDeviceError,
    _state,
    another_gpu,
    as_cuda,
    current_device,
    own_indices,
    set_device,
    told,
    users_line,
)
from .hooks import _apply_checked, _contained_hook, _module_backward_hooks, rnns_in_eval_refuse_backward
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
        return told(self._device)


class _GeneratorType(type(_RealGenerator)):
    """``torch.Generator`` while simulating: one of the simulated GPU gives a ``SimulatedGenerator``."""

    def __call__(cls, device: Any = "cpu") -> torch.Generator:
        if torch.device(_placed_device(device, "torch.Generator")).type == DEVICE_TYPE:
            return SimulatedGenerator(current_device())
        return _RealGenerator(device)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _RealGenerator)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _RealGenerator)


_Generator = _GeneratorType("Generator", (_RealGenerator,), {})


_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}


class _CodeChecks(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _kept:
            raise_kept()  # back in Python after a backward pass that kept one
        try:
            # Every call of a torch function comes here: most ask for nothing these checks look at.
            if (not kwargs or ("device" not in kwargs and "generator" not in kwargs)) and _ordinary(func):
                return func(*args, **(kwargs or {}))
            kwargs = kwargs or {}
            handler = _HANDLERS.get(func)
            if handler is not None:
                return handler(self, func, args, kwargs)
            result = _checked(func, args, kwargs)
            if func in _MAKERS:
                made_here(result)
            return result
        except RuntimeError as err:
            # PyTorch's own checks of devices name no tensor: the call's operands are kept for the explanation.
            if not hasattr(err, "_audit_operands"):  # read by explain.py
                err._audit_operands = (args, kwargs)
            raise


def _ordinary(func) -> bool:
    """Whether ``func`` is none of those this mode handles, nor checked by its name (``.to``, ``.cuda``)."""
    try:
        return not (func in _SPECIAL or getattr(func, "__name__", None) in ("cuda", "to"))
    except TypeError:  # a function that cannot be hashed: checked as any other
        return False


def _kept_in_backward(err: SimulatedDeviceError) -> None:
    """Raise ``err``, or in a hook the autograd engine runs, keep it to raise when the backward pass returns."""
    if not in_backward():
        raise err
    keep(err)


def _checked(func, args, kwargs):
    """``func(*args, **kwargs)`` where the code asks for nothing a GPU run refuses, with the devices it names placed."""
    try:
        func, args, kwargs = _placed(func, args, kwargs)
    except SimulatedDeviceError as err:
        _kept_in_backward(err)
        func, args, kwargs = _as_on_the_gpu(func, args, kwargs)
    return func(*args, **kwargs)


def _placed(func, args, kwargs):
    """The call with the devices it names placed (``_placed_device``); raise ``SimulatedDeviceError`` where the
    code asks for what a GPU run refuses."""
    if func in _TO_NUMPY and isinstance(args[0], SimulatedTensor):
        raise SimulatedDeviceError(
            f"can't convert {as_cuda(args[0].device)} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first.",
            kind="numpy",
            operation="Tensor.numpy",
            devices=(as_cuda(args[0].device),),
        )
    name = getattr(func, "__name__", str(func))
    if name == "cuda":  # Tensor.cuda(device=None, non_blocking=False, memory_format=...): a move to that GPU
        index = args[1] if len(args) > 1 else kwargs.get("device")
        device = torch.device("cuda", index) if isinstance(index, int) else torch.device(index or "cuda")
        rest = {key: value for key, value in kwargs.items() if key != "device"}
        return torch.Tensor.to, (args[0], _placed_device(device, "Tensor.cuda", ".cuda()")), rest
    if "device" in kwargs:
        kwargs = {**kwargs, "device": _placed_device(kwargs["device"], name)}
    if name == "to":
        args = (args[0], *(_placed_device(arg, "Tensor.to") for arg in args[1:]))
        if _state.index and getattr(args[0], "_made_before", False):
            kwargs = {**kwargs, "copy": True}  # made on GPU 0: a move to this process's GPU copies it
    if kwargs.get("generator") is not None:
        _check_generator(name, args, kwargs)
    return func, args, kwargs


def _as_on_the_gpu(func, args, kwargs):
    """A refused call as it runs on the simulated GPU, so that a hook goes on until the backward pass returns."""
    if func in _TO_NUMPY:
        return func, (to_cpu(args[0]), *args[1:]), kwargs
    if getattr(func, "__name__", None) == "cuda":
        return torch.Tensor.to, (args[0], current_device()), {}

    def simulated(value):
        return current_device() if isinstance(value, str | torch.device) and "cuda" in str(value) else value

    return func, tuple(simulated(arg) for arg in args), {name: simulated(value) for name, value in kwargs.items()}


# The autograd engine's check of root gradients (engine.cpp, validate_outputs), which PyTorch skips for tensor
# subclasses: a gradient for an output on another device is refused, unless it is 0-dim (moved). By function
# that starts a pass: its name, its outputs' argument, and its gradients' argument and position.
_ROOTS = {
    torch.Tensor.backward: ("Tensor.backward", "self", "gradient", 1),
    torch.autograd.backward: ("torch.autograd.backward", "tensors", "grad_tensors", 1),
    torch.autograd.grad: ("torch.autograd.grad", "outputs", "grad_outputs", 2),
}


def _check_root_gradients(func, args, kwargs) -> None:
    operation, outputs, argument, position = _ROOTS[func]
    outputs = args[0] if args else kwargs.get(outputs)
    grads = args[position] if len(args) > position else kwargs.get(argument)
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    grads = (grads,) if isinstance(grads, torch.Tensor) else () if grads is None else tuple(grads)
    for index, (output, grad) in enumerate(zip(outputs, grads, strict=False)):
        if not isinstance(output, torch.Tensor) or not isinstance(grad, torch.Tensor) or grad.dim() == 0:
            continue
        if grad.device != output.device:
            expected, got = as_cuda(output.device), as_cuda(grad.device)
            raise SimulatedDeviceError(
                f"invalid gradient at index {index} - expected device {expected} but got {got}",
                kind="root gradient",
                operation=operation,
                devices=(expected, got),
                argument=argument,
                culprit=grad,
            )


def _backward(mode, func, args, kwargs):
    """A call that starts a backward pass: its root gradients checked, the pass run with these checks on."""
    try:
        _check_root_gradients(func, args, kwargs)
    except SimulatedDeviceError as err:
        _kept_in_backward(err)
    try:
        return func(*args, **kwargs)
    finally:
        raise_kept()  # what the pass kept, in place of whatever the engine stopped on


_ENGINE_RUN = torch.autograd._engine_run_backward


def _engine_run_checked(*args, **kwargs):
    """The engine's run of a backward pass, with these checks on for the hooks it runs (it is reached from a
    handler of this mode, where the mode is off)."""
    with _CodeChecks():
        return _ENGINE_RUN(*args, **kwargs)


def _register_hook(mode, func, args, kwargs):
    return func(args[0], _contained_hook(args[1]), *args[2:], **kwargs)


def _moves(mode, func, args, kwargs):
    """``.to()`` and ``.cpu()``: an uninitialised parameter moves in place (``lazy``); a device tensor moved to the
    CPU is one the code made there."""
    if is_lazy(args[0]):
        _, placed_args, placed_kwargs = _placed(func, args, kwargs)
        done = lazy.moved(args[0], placed_args[1:] if func is torch.Tensor.to else ("cpu",), placed_kwargs)
        if done is not None:
            return done
    moved = _checked(func, args, kwargs)
    if moved is not args[0] and isinstance(args[0], SimulatedTensor):
        made_here(moved)
    return moved


# The functions that make a tensor (a CPU one where no device is given): where the code makes the CPU tensor
# that a GPU then refuses.
_MAKERS = frozenset(
    function
    for namespace, names in (
        (
            torch,
            "zeros ones empty full arange range linspace logspace eye rand randn randint randperm normal tensor "
            "as_tensor asarray from_numpy frombuffer scalar_tensor tril_indices triu_indices zeros_like ones_like "
            "empty_like full_like rand_like randn_like randint_like hann_window hamming_window blackman_window "
            "bartlett_window kaiser_window",
        ),
        (torch.Tensor, "new_zeros new_ones new_empty new_full new_tensor"),
    )
    for name in names.split()
    if (function := getattr(namespace, name, None)) is not None
)


def made_here(tensor: Any) -> None:
    """Mark a CPU ``tensor`` the user's code has just made with that code's line (``made_at`` reads it)."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and "_audit_made_at" not in vars(tensor):
        line = users_line()
        if line is not None:
            tensor._audit_made_at = line


def made_at(tensor: torch.Tensor) -> tuple[str, int] | None:
    """Where the user's code made ``tensor`` (or the tensor it views), as ``(filename, lineno)``, if seen."""
    for candidate in (tensor, tensor._base):
        found = vars(candidate).get("_audit_made_at") if isinstance(candidate, torch.Tensor) else None
        if found is not None:
            return found
    return None


def _pinned(mode, func, args, kwargs) -> torch.Tensor:
    """Pinning changes no device: a CPU tensor stays as it is; a GPU tensor's fails (ATen's ``Memory.cpp``)."""
    if isinstance(args[0], SimulatedTensor):
        raise SimulatedDeviceError(
            f"cannot pin 'torch.cuda.{args[0].elem.type().rpartition('.')[2]}' only dense CPU tensors can be pinned",
            kind="pin memory",
            operation="Tensor.pin_memory",
            devices=(as_cuda(current_device()),),
        )
    return args[0]


_HANDLERS = {
    torch.Tensor.backward: _backward,
    torch.autograd.backward: _backward,
    torch.autograd.grad: _backward,
    torch.Tensor.register_hook: _register_hook,
    torch.Tensor.register_post_accumulate_grad_hook: _register_hook,
    torch.Tensor.to: _moves,
    torch.Tensor.cpu: _moves,
    torch.Tensor.pin_memory: _pinned,
    torch.Tensor.is_pinned: lambda mode, func, args, kwargs: False,
}
_SPECIAL = {*_HANDLERS, *_TO_NUMPY, *_MAKERS}  # the functions this mode does more than place devices for


def _check_generator(operation: str, args, kwargs) -> None:
    """A random operation takes a generator of the device it makes its tensor on, as CUDA requires."""
    device = kwargs.get("device")
    tensors = (arg.device for arg in tree_flatten(args)[0] if isinstance(arg, torch.Tensor))
    device = torch.device(device) if device is not None else next(tensors, _CPU)
    generator = kwargs["generator"]
    if (device.type == DEVICE_TYPE) != isinstance(generator, SimulatedGenerator):
        expected, found = ("cuda", "cpu") if device.type == DEVICE_TYPE else (device.type, "cuda")
        raise SimulatedDeviceError(
            f"Expected a '{expected}' device type for generator but found '{found}'",
            kind="generator",
            operation=operation,
            devices=(as_cuda(device), as_cuda(generator.device)),
        )


def _placed_device(value: Any, operation: str, named: str | None = None) -> Any:
    """``value``, a device argument, with the process's own GPU as PyTorch sees it (``_state.physical``); raise
    ``SimulatedDeviceError`` for another process's. A CUDA device the code names itself, not one it was told
    (``x.device``), is kept for ``named_cuda``, as ``named`` says it.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        device = torch.device("cuda", value)  # what PyTorch makes of a bare index
    elif isinstance(value, str | torch.device):
        try:
            device = torch.device(value)
        except RuntimeError:
            return value
    else:
        return value
    if device.type not in ("cuda", DEVICE_TYPE):
        return value
    if torch.utils.data.get_worker_info() is not None:  # a DataLoader's worker, forked from a process using CUDA
        raise SimulatedDeviceError(FORKED_WORKER, kind="CUDA in a worker", operation=operation)
    index = _state.index if device.index is None else device.index
    if index != _state.index and (device.type == "cuda" or users_line() is not None):
        raise another_gpu(operation, index)
    if device.type == "cuda" and value is not _CUDA[index] and (line := users_line()) is not None:
        _named.setdefault(line, named or f"device={value!r}")
    return _state.physical if index == _state.index else value


# What CUDA says in a process forked after it was initialised (torch/cuda/__init__.py, _lazy_init): a DataLoader's
# workers are forked on Linux, and Lightning has moved the model to the GPU before they start.
FORKED_WORKER = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' "
    "start method"
)
_named: dict[tuple[str, int], str] = {}  # each line of the user's code that names CUDA itself, and how


def named_cuda() -> list[tuple[str, int, str]]:
    """The lines of the user's code that named CUDA itself, and how, since ``forget_notes``."""
    return [(filename, lineno, how) for (filename, lineno), how in _named.items()]


def forget_notes() -> None:
    """Forget what ``named_cuda`` and ``deterministic.warned`` say, for a new audit."""
    for seen in (_named, _warned, _forward_lines):
        seen.clear()


@contextmanager
def simulating(
    index: int = 0, is_user_code: Callable[[str], bool] | None = None, building: bool = False
) -> Iterator[None]:
    """Inside the block: ``simgpu:<index>`` (1 plays a DDP run's second process) is the current device, CUDA to the
    user's code, which ``is_user_code`` tells from libraries' (by default: a file outside the libraries installed).
    With ``building``, as before Lightning sets the process's GPU: what is made on the GPU is on GPU 0 in every
    process (``tensor.py``).
    """
    enable()
    previous = _state.index, _state.is_user_code, _state.answering, _state.user_files, _state.building
    set_device(index)
    _state.building = building
    if is_user_code is not None:
        _state.is_user_code = is_user_code
    _state.user_files = {}
    discard()  # nothing of an earlier run is raised in this one
    default_device = torch.get_default_device()
    try:
        # torch.compile cannot trace these tensors. Backward passes run on this thread (the engine counted its
        # device threads at the process's first backward pass, which may have come before the simulated GPU).
        with (
            torch._dynamo.config.patch(disable=True),
            torch.autograd.set_multithreading_enabled(False),
            mock.patch.object(torch, "Generator", _Generator),
            mock.patch.object(torch, "compile", _as_written),
            mock.patch.object(BackwardHook, "__init__", _module_backward_hooks),
            mock.patch.object(torch.autograd.Function, "apply", _apply_checked),
            mock.patch.object(torch.autograd, "_engine_run_backward", _engine_run_checked),
            _CodeChecks(),
            own_indices(),
            _foreach_path("torch.optim.optimizer"),
            _foreach_path("torch.utils._foreach_utils"),
            cuda_api.replaced(),
            in_place.moves_in_place(),
            rnns_in_eval_refuse_backward(),
        ):
            _state.answering = True
            try:
                yield
            finally:
                raise_kept()  # one kept in a backward pass that no call of ours saw return
    finally:
        _state.index, _state.is_user_code, _state.answering, _state.user_files, _state.building = previous
        if torch.get_default_device() != default_device:  # the code set it (to the simulated GPU): as found
            torch.set_default_device(None if default_device == torch.device("cpu") else default_device)


def _foreach_path(module: str) -> Any:
    """The tensor types of ``module`` that take PyTorch's foreach (multi-tensor) kernels, with the simulated GPU's:
    a GPU runs Adam or clip_grad_norm_ as one operation over the parameters (PyTorch lists no tensor subclass).
    torch.optim deletes its submodules' names: found in sys.modules."""
    types = sys.modules[module]._foreach_supported_types
    return mock.patch.object(sys.modules[module], "_foreach_supported_types", [*types, SimulatedTensor])


def _as_written(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` while simulating: the model or function runs as written."""
    return model if model is not None else _as_written
