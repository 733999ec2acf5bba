"""The tensor on the simulated GPU: an ordinary CPU tensor inside, checked by CUDA's rules at every operation."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_leaves, tree_map

from . import memory
from .containment import contained
from .deterministic import alert_of
from .devices import (
    _CPU,
    _CUDA,
    _SIMULATED,
    DEVICE_TYPE,
    NotSimulatedError,
    SimulatedDeviceError,
    _state,
    asked_by_user,
    cannot_run,
    is_users,
    told,
)
from .gpu_only import _on_the_cpu
from .rules import (
    CONVOLUTIONS,
    _check_devices,
    _host_arguments,
    _rule,
    check_host_arguments,
    cuda_paths,
    mixed_operands,
)


class SimulatedTensor(torch.Tensor):
    """A tensor on the current simulated GPU, its values in ``self.elem``, a CPU tensor; to PyTorch always on index 0
    (its autograd engine serves a Python device one index only), to the user's code on CUDA while simulating."""

    elem: torch.Tensor
    # Python-level functions pass straight through to __torch_dispatch__.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "SimulatedTensor":
        return _wrapped(elem)

    @property
    def device(self) -> torch.device:
        return (_CUDA if asked_by_user() else _SIMULATED)[self.get_device()]

    @property
    def is_cuda(self) -> bool:
        # Also to torch.nn.functional, which routes some operations to deterministic decompositions on CUDA.
        filename = sys._getframe(1).f_code.co_filename
        return _state.answering and (is_users(filename) or filename == _FUNCTIONAL)

    def get_device(self) -> int:
        return 0 if "_made_before" in self.__dict__ else _state.index  # made on GPU 0 in every process

    def type(self, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs and asked_by_user():
            return "torch.cuda." + self.elem.type().rpartition(".")[2]  # torch.cuda.FloatTensor, ...
        return super().type(dtype, non_blocking, **kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return repr(self.elem)[:-1] + f", device='{told(_SIMULATED[_state.index])}')"

    def tolist(self) -> Any:
        return self.elem.tolist()

    def __format__(self, spec: str) -> str:
        return self.elem.__format__(spec)  # f"{loss:.3f}" of a 0-dim tensor formats its value

    @classmethod
    @contained(benign=lambda cls, func, types, args=(), kwargs=None: _run(func, args, kwargs or {}))
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _state.made_before and _state.index and _made_before(func, args, kwargs or {}):
            return _marked(_dispatch(func, args, kwargs))  # of tensors on GPU 0 alone: there too
        return _dispatch(func, args, kwargs)


def _dispatch(func, args, kwargs):
    """An operation checked by CUDA's rules, computed on the CPU, its results wrapped; ``NotSimulatedError`` where
    the simulated GPU's own steps fail."""
    global _operations
    _operations += 1
    kwargs = kwargs or {}
    try:
        plan = _plan(func)
        if plan.alert is not None:  # a kernel that deterministic mode refuses on CUDA
            plan.alert.check(args, kwargs)
        rule = None
        if not plan.metadata:
            cpu_args, cpu_kwargs, held = _unwrapped(args, kwargs)
            if plan.host is not None:
                check_host_arguments(func, args, kwargs)
            if held & _ELSEWHERE and plan.path is None:  # a tensor not on the device: CUDA's checks
                rule = plan.rule
                if rule != "composite" and rule != "implicit":
                    _check_devices(func, rule, args, kwargs)
    except (SimulatedDeviceError, Warning):
        raise
    except Exception as err:
        raise cannot_run(func, err) from err
    if plan.metadata:  # a compressed sparse tensor's layout and strides: those of the tensor inside
        return func(args[0].elem, *args[1:])
    if plan.path is not None:
        return plan.path(*args, **kwargs)
    if rule is not None and plan.convolution:  # CUDA checks a convolution's operands' types before anything
        refused = mixed_operands(func, args, kwargs)
        if refused is not None:
            raise refused
    if rule == "composite" or rule == "implicit":
        # CUDA runs it as other operations: check those. A CPU operand none of them refuses before one the simulated
        # GPU has no kernel for is refused as CUDA refuses the mix (a CPU weight of a convolution).
        try:
            if rule == "composite":
                return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
            return func.decompose(*args, **kwargs)
        except (NotImplementedError, NotSimulatedError) as err:
            refused = mixed_operands(func, args, kwargs)
            if refused is None:
                raise
            raise refused from err
    return _on_device(plan, args, kwargs, cpu_args, cpu_kwargs, held)


_FUNCTIONAL = torch.nn.functional.__file__

# ``torch.inference_mode(False)`` without that class's Python steps, which cost more than the view they are taken for.
_NOT_INFERENCE = torch._C._InferenceMode

_HERE, _ELSEWHERE = 1, 2  # what an operation's arguments hold: a tensor of the device's, one of another device


def _unwrapped(args, kwargs) -> tuple[tuple, dict, int]:
    """``args`` and ``kwargs`` with each simulated tensor replaced by the CPU tensor inside, and what they held
    (``_HERE | _ELSEWHERE``). By hand, in one pass: pytree's walk costs 20 times this, at every operation."""
    held, cpu_args, cpu_kwargs = 0, [], {}
    for name, value in (*enumerate(args), *kwargs.items()) if kwargs else enumerate(args):
        sequence = type(value) is list or type(value) is tuple
        items = []
        for item in value if sequence else (value,):
            if isinstance(item, torch.Tensor):
                if isinstance(item, SimulatedTensor):
                    item, held = item.elem, held | _HERE
                else:
                    held |= _ELSEWHERE
            items.append(item)
        value = type(value)(items) if sequence else items[0]
        if type(name) is int:
            cpu_args.append(value)
        else:
            cpu_kwargs[name] = value
    return tuple(cpu_args), cpu_kwargs, held


def _run(func, args, kwargs):
    """``func`` run on the CPU tensors inside, unchecked, its results on the simulated GPU (unless sent elsewhere)."""
    try:
        plan = _plan(func)
        unwrapped = _unwrapped(args, kwargs)
    except Exception as err:
        raise cannot_run(func, err) from err
    return _on_device(plan, args, kwargs, *unwrapped)


def _on_device(plan: "_Plan", args, kwargs, cpu_args, cpu_kwargs, held: int):
    """The operation computed on the CPU, its results on the simulated GPU where its tensors are (``held``) or the
    device it names is (an in-place or ``out=`` operation's: the tensors it was given)."""
    func, simulated = plan.func, bool(held & _HERE)
    try:
        position = plan.position
        given = position is not None and position < len(args) and args[position] is not None
        explicit = args[position] if given else kwargs.get("device")  # x.to(device, dtype) names it by position
        if explicit is not None:
            simulated = torch.device(explicit).type == DEVICE_TYPE
            if simulated and given:
                cpu_args = (*cpu_args[:position], _CPU, *cpu_args[position + 1 :])
            elif simulated:
                cpu_kwargs["device"] = _CPU
    except Exception as err:
        raise cannot_run(func, err) from err
    try:
        out = plan.compute(*cpu_args, **cpu_kwargs)
    except NotImplementedError as err:  # no CPU kernel for these tensors' layout or dtype: a GPU may have one
        if func.namespace != "aten":
            raise  # a library's own kernel, which refuses them itself
        raise cannot_run(func, err) from err
    if not simulated:
        return out
    try:
        if plan.inplace_view:  # unsqueeze_, transpose_, ...: the wrapper's shape changes too
            return return_and_correct_aliasing(func, args, kwargs, _results(plan, out))
        if plan.written is None:
            return _results(plan, out)
        if not plan.written:
            return None  # an in-place operation that returns nothing (GradScaler's unscaling)
        arguments = func._schema.arguments
        given = [args[i] if i < len(args) else kwargs[arguments[i].name] for i in plan.written]
        return given[0] if plan.single else tuple(given)
    except Exception as err:
        raise cannot_run(func, err) from err


def _results(plan: "_Plan", out):
    if plan.view and torch.is_inference_mode_enabled():
        # PyTorch shares a view's version counter with its base: it must not be an inference tensor.
        with _NOT_INFERENCE(False):
            return _wrap(out, False)
    return _wrap(out, not plan.view)


_make_wrapper = torch.Tensor._make_wrapper_subclass


def _wrapped(elem: torch.Tensor, counted: bool = True) -> SimulatedTensor:
    """``elem`` on the simulated GPU, its memory counted unless it is a view's (counted with its base)."""
    try:
        wrapper = _make_wrapper(
            SimulatedTensor,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=_state.physical,
        )
    except RuntimeError:
        if elem.layout == torch.strided:
            raise
        # The compressed sparse layouts (CSR, CSC, BSR, BSC) have no strides, nor one storage, and a wrapper cannot
        # take their layout: it asks __torch_dispatch__ for its layout and strides, answered with elem's (_METADATA).
        wrapper = _make_wrapper(
            SimulatedTensor,
            elem.size(),
            dtype=elem.dtype,
            device=_state.physical,
            dispatch_layout=True,
            dispatch_sizes_strides_policy="strides",
        )
    wrapper.elem = elem
    if _state.building:
        wrapper._made_before = _state.made_before = True
    if counted:
        memory.track(elem)
    return wrapper


_operations = 0  # how many operations the simulated GPU has run in this process


@contextmanager
def count_operations() -> Iterator[SimpleNamespace]:
    """``counted.count``: the operations run inside the block."""
    counted, start = SimpleNamespace(count=0), _operations
    try:
        yield counted
    finally:
        counted.count = _operations - start


class _Plan:
    """What the simulated GPU needs to know of one operation, read from its schema once (every call asks it)."""

    __slots__ = ("alert", "compute", "convolution", "func", "host", "inplace_view", "metadata", "path", "position")
    __slots__ += ("rule", "single", "view", "written")

    def __init__(self, func) -> None:
        self.func = func
        self.metadata = func in _METADATA
        self.host = _host_arguments().get(func)
        self.alert = alert_of(func)
        self.path = cuda_paths().get(func)
        arguments, returns = func._schema.arguments, func._schema.returns
        # The position of ``device`` where it may be given by position (x.to(device, dtype)), or None.
        self.position = next(
            (n for n, argument in enumerate(arguments) if argument.name == "device" and not argument.kwarg_only), None
        )
        self.compute = _on_the_cpu(func)
        self.view = any(result.alias_info is not None and not result.alias_info.is_write for result in returns)
        self.inplace_view = torch.Tag.inplace_view in func.tags
        # The positions of the arguments an in-place or ``out=`` operation returns; None for other operations.
        aliases = [result.alias_info for result in returns]
        self.written = None
        if all(alias is not None and alias.is_write for alias in aliases):
            self.written = tuple(
                next(n for n, argument in enumerate(arguments) if _same_alias(argument.alias_info, alias))
                for alias in aliases
            )
        self.single = len(returns) == 1
        self.convolution = func._schema.name.split("::")[-1] in CONVOLUTIONS
        self.rule = _rule(func)  # how CUDA checks its tensors' devices


# By the operation's id, with the operation itself to tell a reused id: OpOverload hashes in Python.
_plans: dict[int, _Plan] = {}


def _plan(func) -> _Plan:
    plan = _plans.get(id(func))
    if plan is None or plan.func is not func:
        plan = _plans[id(func)] = _Plan(func)
    return plan


# What the wrapper of a compressed sparse tensor asks __torch_dispatch__ about itself.
_METADATA = frozenset(
    [torch.ops.prim.layout.default, torch.ops.aten.sym_storage_offset.default]
    + [
        getattr(torch.ops.aten, name).default
        for name in ("stride", "sym_stride", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense")
    ]
)


def _wrap(out, counted: bool = True):
    if isinstance(out, torch.Tensor):
        return _wrapped(out, counted) if out.is_cpu else out
    if type(out) in (list, tuple):
        return type(out)(_wrap(item, counted) for item in out)
    return out


def _same_alias(given, returned) -> bool:
    return given is not None and given.before_set == returned.before_set


# Moves and copies between GPUs, which CUDA makes of a tensor made before the process's GPU was set (_made_before).
_MOVES = frozenset([torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default])


def _made_before(func, args, kwargs) -> bool:
    """Whether every simulated tensor ``func`` is given was made on GPU 0 before Lightning set the process's GPU
    (``simulating(building=True)``: at import, in a constructor); none: False. ``SimulatedDeviceError`` where such
    a tensor meets this process's own, as CUDA refuses GPU 0's and 1's."""
    tensors = [value for value in tree_leaves((args, kwargs)) if isinstance(value, SimulatedTensor)]
    before = [tensor for tensor in tensors if getattr(tensor, "_made_before", False)]
    if not before or func in _MOVES:
        return False
    if len(before) == len(tensors):
        return True
    ours, theirs = f"cuda:{_state.index}", "cuda:0"
    raise SimulatedDeviceError(
        f"Expected all tensors to be on the same device, but found at least two devices, {ours} and {theirs}! "
        f"(a tensor made on {theirs} before Lightning set this process's GPU, at import or in a constructor, "
        "and never moved)",
        kind="another GPU",
        operation=str(func),
        devices=(ours, theirs),
        culprit=before[0],
    )


def _marked(out):
    for tensor in tree_leaves(out):
        if isinstance(tensor, SimulatedTensor):
            tensor._made_before = True
    return out


def to_cpu(value: Any) -> Any:
    """``value`` with every simulated tensor in it replaced by the CPU tensor inside."""
    return tree_map(lambda leaf: leaf.elem if isinstance(leaf, SimulatedTensor) else leaf, value)
