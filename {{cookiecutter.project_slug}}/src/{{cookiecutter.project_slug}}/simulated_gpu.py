"""A simulated GPU: real values computed on the CPU, CUDA's rules for where tensors may meet.

The device audit (``placement.py``) trains the model on this device. Everything a GPU
run executes runs here too, with real numbers: forward, backward, optimizer steps,
``.item()``, boolean masks, ``nonzero``, ``unique``. What differs is where the tensors
are said to be: on ``simgpu:0`` (or ``simgpu:1``, to play a second DDP process). An
operation that mixes devices stops exactly where it would on a CUDA GPU, with CUDA's
error message.

How it works:

- ``simgpu`` is PyTorch's spare device type, PrivateUse1, renamed, with Python hooks.
- A tensor on it is a ``SimulatedTensor``, a wrapper that holds an ordinary CPU tensor
  with the values. Every operation on one reaches ``__torch_dispatch__``, which checks
  the devices of all its tensors by CUDA's rules, runs the operation on the CPU tensors
  inside, and wraps the results.
- CUDA's rules come from PyTorch's own operator declarations
  (``native_functions.yaml``, shipped with torch): most operations require all tensors
  on one device; element-wise ones ("TensorIterator") also accept 0-dim CPU tensors;
  indexing accepts CPU indices; copies and ``.to()`` cross devices. An operation that
  CUDA runs as a composition of others is checked through those others.
- Allocations on ``simgpu`` with no tensor of it involved (``torch.zeros(...,
  device=...)``, ``batch.to(device)``) come through kernels registered for PrivateUse1.
- A process has one GPU: every simulated tensor is on the current device, ``simgpu:0``
  or ``simgpu:1``. Code of the user's that asks for another index stops there.
- Inside ``simulating()``: ``torch.Generator(device="simgpu")`` works, a CUDA device
  written into code (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``, ``.cuda()``)
  stops with ``SimulatedDeviceError``, and so does ``.numpy()`` of a device tensor.

Private and experimental PyTorch APIs this relies on, all of them in this module and
nowhere else in the project (tested with torch 2.10 and 2.14):

- ``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` (new in
  torch 2.10: older versions stop with ``SimulationUnavailableError``);
- ``torch.Tensor._make_wrapper_subclass``, and
  ``torch.utils._python_dispatch.return_and_correct_aliasing`` for in-place view operations;
- ``torch.library.Library.impl`` and ``.fallback`` for the ``PrivateUse1`` key;
- ``OpOverload._op_dk``, to run an operation's ``CompositeExplicitAutograd`` kernel, and
  ``torch._C._dispatch_has_computed_kernel_for_dispatch_key`` with
  ``torch._decomp.decomposition_table``, for operations PyTorch runs on GPUs only (the fused
  LSTM and GRU cells are computed here in CPU operations);
- ``torchgen/packaged/ATen/native/native_functions.yaml``, read as text;
- ``torch.Generator`` is replaced while ``simulating()`` is active (PrivateUse1 has no
  generators of its own in Python), and so is ``torch.compile``, with
  ``torch._dynamo.config.disable`` set: compiled code runs as written, since TorchDynamo
  cannot trace these tensors.
"""

import functools
import re
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch._decomp
import torch._dynamo
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE_TYPE = "simgpu"
DEVICE_COUNT = 2  # a single device, or two DDP processes on one node
_CPU = torch.device("cpu")
_RealGenerator = torch.Generator


class SimulationUnavailableError(RuntimeError):
    """This PyTorch cannot host the simulated device."""


class NotSimulatedError(RuntimeError):
    """An operation the simulated GPU cannot run: PyTorch has it for GPUs only."""


class SimulatedDeviceError(RuntimeError):
    """What a CUDA GPU would refuse.

    Attributes:
        kind: ``"mixed devices"``, ``"generator"``, ``"hard-coded device"``, ``"numpy"`` or
            ``"sync_dist"`` (a collective operation on a tensor off the process's GPU).
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


# ----------------------------------------------------------------------------- the tensor


class SimulatedTensor(torch.Tensor):
    """A tensor on the simulated GPU: its values live in ``self.elem``, an ordinary CPU tensor.

    A process has one GPU, so every simulated tensor is on the current device: ``simgpu:0``,
    or ``simgpu:1`` while playing the second process of a DDP run. (Inside PyTorch they are
    all on index 0: its autograd engine serves Python devices one index only.)
    """

    elem: torch.Tensor
    # Python-level functions pass straight through to __torch_dispatch__.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "SimulatedTensor":
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=_state.physical,
            requires_grad=False,
        )
        wrapper.elem = elem
        return wrapper

    @property
    def device(self) -> torch.device:
        return current_device()

    def get_device(self) -> int:
        return _state.index

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return repr(self.elem)[:-1] + f", device='{self.device}')"

    def tolist(self) -> Any:
        """The values as Python numbers, as ``tolist()`` of a CUDA tensor gives them."""
        return self.elem.tolist()

    def __format__(self, spec: str) -> str:
        return self.elem.__format__(spec)  # f"{loss:.3f}" of a 0-dim tensor formats its value

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {tensor.device for tensor in _tensors(args, kwargs)}
        if len(devices) > 1:
            rule = _rule(func)
            if rule == "composite":
                # CUDA runs it as other operations: check those.
                return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
            _check_devices(func, rule, args, kwargs)
        return _run(func, args, kwargs)


def _run(func, args, kwargs):
    """Run ``func`` on the CPU tensors inside, and put its results on the simulated GPU (unless sent elsewhere)."""
    explicit = kwargs.get("device")
    explicit = None if explicit is None else torch.device(explicit)
    simulated = explicit.type == DEVICE_TYPE if explicit is not None else _any_simulated(args, kwargs)
    cpu_args = tuple(_unwrap(arg) for arg in args)
    cpu_kwargs = {name: _unwrap(value) for name, value in kwargs.items()}
    if explicit is not None and simulated:
        cpu_kwargs["device"] = _CPU
    out = _on_the_cpu(func)(*cpu_args, **cpu_kwargs)
    if not simulated:
        return out
    if _is_view(func) and torch.is_inference_mode_enabled():
        # PyTorch shares a view's version counter with its base: it must not be an inference tensor.
        with torch.inference_mode(False):
            wrapped = _wrap(out)
    else:
        wrapped = _wrap(out)
    if torch.Tag.inplace_view in func.tags:  # unsqueeze_, transpose_, ...: the wrapper's shape changes too
        from torch.utils._python_dispatch import return_and_correct_aliasing

        return return_and_correct_aliasing(func, args, kwargs, wrapped)
    written = _written_arguments(func)
    if written is None:
        return wrapped
    # An in-place or out= operation returns the very tensors it was given.
    arguments = func._schema.arguments
    given = [args[i] if i < len(args) else kwargs[arguments[i].name] for i in written]
    return given[0] if len(func._schema.returns) == 1 else tuple(given)


@functools.cache
def _on_the_cpu(func) -> Callable[..., Any]:
    """``func``, or for an operation PyTorch runs only on GPUs, the same computation in CPU operations."""
    if func.namespace != "aten" or torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), "CPU"):
        return func
    if func in _GPU_ONLY:
        return _GPU_ONLY[func]
    if func in torch._decomp.decomposition_table:
        return torch._decomp.decomposition_table[func]
    return functools.partial(_not_simulated, func)


def _not_simulated(func, *args, **kwargs):
    raise NotSimulatedError(f"{func} runs only on GPUs, and no CPU computation of it is known to simulate it with")


# LSTM and GRU cells take fused kernels on every device but the CPU. The same arithmetic
# in CPU operations, with a workspace of our own layout that only our backward reads.
def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_cy = (torch.zeros_like(cy) if grad_cy is None else grad_cy) + grad_hy * o * (1 - tanh_cy**2)
    grad_gates = torch.cat(
        [
            grad_cy * g * i * (1 - i),
            grad_cy * cx * f * (1 - f),
            grad_cy * i * (1 - g**2),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        1,
    )
    return grad_gates, grad_cy * f, grad_gates.sum(0) if has_bias else None


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    (ir, ii, in_), (hr, hi, hn) = input_gates.chunk(3, 1), hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n**2)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input, grad_hidden = torch.cat([grad_r, grad_z, grad_n], 1), torch.cat([grad_r, grad_z, grad_n * r], 1)
    biases = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
    return grad_input, grad_hidden, grad_hy * z, *biases


_GPU_ONLY = {
    torch.ops.aten._thnn_fused_lstm_cell.default: _lstm_cell,
    torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default: _lstm_cell_backward,
    torch.ops.aten._thnn_fused_gru_cell.default: _gru_cell,
    torch.ops.aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward,
}


# Operations take and return tensors, numbers, and lists or tuples of them: flat and fast to walk.
def _unwrap(value):
    if isinstance(value, SimulatedTensor):
        return value.elem
    if type(value) in (list, tuple):
        return type(value)(_unwrap(item) for item in value)
    return value


def _wrap(out):
    if isinstance(out, torch.Tensor):
        return SimulatedTensor(out) if out.device.type == "cpu" else out
    if type(out) in (list, tuple):
        return type(out)(_wrap(item) for item in out)
    return out


@functools.cache
def _is_view(func) -> bool:
    return any(result.alias_info is not None and not result.alias_info.is_write for result in func._schema.returns)


@functools.cache
def _written_arguments(func) -> tuple[int, ...] | None:
    """The positions of the arguments an in-place or ``out=`` operation returns, or None for other operations."""
    arguments, written = func._schema.arguments, []
    for result in func._schema.returns:
        alias = result.alias_info
        if alias is None or not alias.is_write:
            return None
        written.append(
            next(
                position
                for position, argument in enumerate(arguments)
                if argument.alias_info is not None and argument.alias_info.before_set == alias.before_set
            )
        )
    return tuple(written)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif type(value) in (list, tuple):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


def _any_simulated(args, kwargs) -> bool:
    return any(isinstance(tensor, SimulatedTensor) for tensor in _tensors(args, kwargs))


# ----------------------------------------------------------------------------- CUDA's rules


def _check_devices(func, rule: str, args, kwargs) -> None:
    """Raise ``SimulatedDeviceError`` where a CUDA kernel would refuse this mix of devices."""
    if rule == "any":
        return
    common = first = None  # the device the operation runs on, and the tensor that decided it
    for name, tensor, is_output in _named_tensors(func, args, kwargs):
        device = tensor.device
        if rule == "index" and name == "indices":
            continue  # checked below, once the indexed tensor's device is known
        if rule in ("iterator", "index") and device.type == "cpu" and tensor.dim() == 0 and not is_output:
            continue  # a CPU scalar: TensorIterator reads it as a number
        if common is None:
            common, first = device, (name, tensor)
        elif device != common:
            odd = first if common.type == "cpu" else (name, tensor)
            raise _mixed(func, common, device, name if rule == "strict" else None, odd)
    if rule == "index" and common is not None:
        for name, tensor, _ in _named_tensors(func, args, kwargs):
            if name == "indices" and tensor.device not in (common, _CPU):
                raise SimulatedDeviceError(
                    f"indices should be either on cpu or on the same device as the indexed tensor ({as_cuda(common)})",
                    kind="mixed devices",
                    operation=str(func),
                    devices=(as_cuda(common), as_cuda(tensor.device)),
                    argument=name,
                    culprit=tensor,
                )


def _mixed(func, first: torch.device, second: torch.device, argument: str | None, odd) -> SimulatedDeviceError:
    where = f" (when checking argument for argument {argument} in method wrapper_CUDA_{_kernel(func)})"
    odd_name, odd_tensor = odd
    return SimulatedDeviceError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{as_cuda(first)} and {as_cuda(second)}!" + (where if argument else ""),
        kind="mixed devices",
        operation=str(func),
        devices=(as_cuda(first), as_cuda(second)) if odd_tensor.device == second else (as_cuda(second), as_cuda(first)),
        argument=odd_name,
        culprit=odd_tensor,
    )


def _kernel(func) -> str:
    name, overload = func._schema.name.split("::")[-1], func._schema.overload_name
    return f"{name}_{overload}" if overload else f"_{name}"


def _named_tensors(func, args, kwargs) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(argument name, tensor, written to) for every tensor the operation takes, in schema order."""
    for position, argument in enumerate(func._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        is_output = argument.alias_info is not None and argument.alias_info.is_write
        values = value if isinstance(value, list | tuple) else (value,)
        for item in values:
            if isinstance(item, torch.Tensor):
                yield argument.name, item, is_output


_INDEXING = {"index.Tensor", "index.Tensor_out", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index.Tensor"}
_INDEXING |= {"_unsafe_index_put"}


def _rule(func) -> str:
    """How CUDA checks the devices of ``func``'s tensors: strict, iterator, index, any or composite."""
    schema = func._schema
    namespace, name = schema.name.split("::")
    key = f"{name}.{schema.overload_name}" if schema.overload_name else name
    if namespace != "aten":
        return "strict"  # a library's own kernel (torchvision, ...) checks its inputs
    if key in _INDEXING:
        return "index"
    return _declared_rules().get(key, "strict")


@functools.cache
def _declared_rules() -> dict[str, str]:
    """Each aten operation's device check, read from the declarations PyTorch generates its kernels from."""
    import torchgen

    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if not path.is_file():
        raise SimulationUnavailableError(f"{path} is missing: this PyTorch does not ship its operator declarations")
    rules = {}
    for entry in re.split(r"\n(?=- func:)", path.read_text(encoding="utf-8")):
        declared = re.match(r"- func: ([\w.]+)\(", entry)
        if declared is None:
            continue
        check = re.search(r"device_check: NoCheck(.*)", entry)
        dispatch = set(re.findall(r"^ {4}([\w, ]+):", entry, flags=re.MULTILINE))
        backends = {key.strip() for line in dispatch for key in line.split(",")}
        if check is not None:
            comment = check.group(1)
            rules[declared.group(1)] = (
                "iterator" if re.search("TensorIterator|foreach|_index_put_impl_", comment) else "any"
            )
        elif "structured_delegate" not in entry and "CUDA" not in backends and "CompositeExplicitAutograd" in backends:
            rules[declared.group(1)] = "composite"
    return rules


# ----------------------------------------------------------------------------- the backend


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


class _Backend:
    """``torch.simgpu``: what PyTorch and Lightning ask of a device module."""

    @staticmethod
    def is_available() -> bool:
        # What torch.accelerator asks. No: the simulated GPU is for the audit alone, and
        # DataLoader(pin_memory=True) would otherwise pin memory for it.
        return False

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return DEVICE_COUNT

    @staticmethod
    def current_device() -> int:
        return _state.index

    @staticmethod
    def set_device(device: int | torch.device) -> None:
        set_device(device)

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    # Random numbers on the simulated GPU come from the CPU's default generator, so its
    # state is the device's (activation checkpointing saves and restores it, for one).
    _initialized = True

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seeded with the CPU's generator."""

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Seeded with the CPU's generator."""

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Operations run at once: there is nothing to wait for."""

    class device:  # noqa: N801 - torch.cuda.device's name and role
        """``with torch.simgpu.device(i):`` makes ``i`` the current device inside the block."""

        def __init__(self, device: Any) -> None:
            self.index = device if isinstance(device, int) else torch.device(device).index

        def __enter__(self) -> None:
            self.previous = _state.index
            if self.index is not None:
                set_device(self.index)

        def __exit__(self, *exc_info: Any) -> None:
            _state.index = self.previous


@functools.cache
def enable() -> None:
    """Register the ``simgpu`` device type in this process (once; later calls do nothing)."""
    try:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
    except ImportError as err:
        raise SimulationUnavailableError(
            f"the simulated GPU needs torch>=2.10 (its Python device backends); this is torch {torch.__version__}"
        ) from err
    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", DEVICE_TYPE):
        raise SimulationUnavailableError(f"PyTorch's spare device type is already taken by {taken!r} in this process")
    if taken == "privateuseone":
        _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_Backend())
    _state.physical = torch.device(DEVICE_TYPE, 0)
    _declared_rules()
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in (
        ("empty.memory_format", functools.partial(_fallback, torch.ops.aten.empty.memory_format)),
        ("empty_strided", functools.partial(_fallback, torch.ops.aten.empty_strided.default)),
        ("copy_", _copy),
        ("_copy_from", _copy_from),
        ("_copy_from_and_resize", _copy_from),
    ):
        library.impl(name, kernel, "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, dispatch_key="PrivateUse1")
    _libraries.extend((library, fallback))  # a library unregisters its kernels when collected
    _check_backward()


def _check_backward() -> None:
    """PyTorch's autograd engine counts the devices once, at the process's first backward pass."""
    weight = SimulatedTensor(torch.ones(1)).requires_grad_()
    try:
        (weight * 2).sum().backward()
    except RuntimeError as err:
        if "device_ready_queues_" not in str(err):
            raise
        raise SimulationUnavailableError(
            "the simulated GPU must be set up before this process's first backward pass: call "
            f"{__name__}.enable() first (the tests' conftest.py does), or audit in a process of its own "
            f"(python -m {__name__.rpartition('.')[0] or __name__}.placement)"
        ) from None


_libraries: list[torch.library.Library] = []


def _fallback(op, *args, **kwargs):
    """An operation that makes tensors on the simulated device from no tensor of it: run it on the CPU."""
    return _run(op, args, kwargs)


def _copy(self, src, non_blocking: bool = False):
    self.elem.copy_(src.elem if isinstance(src, SimulatedTensor) else src)
    return self


def _copy_from(self, dst, non_blocking: bool = False):
    _copy(dst, self)
    return dst


# ----------------------------------------------------------------------------- while simulating


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


def _asked_by_user_code() -> bool:
    """Whether the innermost caller outside PyTorch (and this module) is the user's code, not a library's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH, __file__)):
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
        with torch._dynamo.config.patch(disable=True), _CodeChecks():
            yield
    finally:
        torch.Generator, torch.compile = _RealGenerator, _compile
        _state.index, _state.is_user_code = previous


_compile = torch.compile


def _as_written(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` while simulating: the model or function is returned to run as written."""
    return model if model is not None else _as_written


def to_cpu(value: Any) -> Any:
    """``value`` with every simulated tensor in it replaced by its CPU values."""
    return tree_map(lambda leaf: leaf.elem if isinstance(leaf, SimulatedTensor) else leaf, value)


# PyTorch has one spare device type, so a process has one simulated GPU. A second copy of
# this module (the package of another project made from this template, in the same
# process) takes over the first copy's names, and so its tensor type, kernels and state.
_first = next(
    (
        module
        for module in list(sys.modules.values())
        if isinstance(module, types.ModuleType)
        and vars(module).get("_SIMULATED_GPU_FIRST_COPY")
        and vars(module).get("__name__") != __name__
    ),
    None,
)
if _first is None:
    _SIMULATED_GPU_FIRST_COPY = True
else:
    globals().update({name: value for name, value in vars(_first).items() if not name.startswith("__")})
    del _SIMULATED_GPU_FIRST_COPY
