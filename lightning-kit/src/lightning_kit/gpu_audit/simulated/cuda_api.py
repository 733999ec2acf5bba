"""While simulating, the simulated GPU is CUDA to the user's code: the branch written for the GPU is the one run.

The user's code (``devices.is_users``) is told what a machine with two A100s (``GPU``) would tell it, and
``torch.autocast("cuda")`` and ``torch.amp.GradScaler("cuda")`` are the simulated GPU's; PyTorch and the other
libraries go on asking the simulated device itself. A function of ``torch.cuda`` with no answer here (CUDA
graphs, NCCL, ...) stops with ``NotSimulatedError`` when the user's code calls it: that branch is not audited,
never passed. Code that imported a function by name before (``from torch.cuda import is_available``) keeps
PyTorch's.
"""

import contextlib
import functools
import time
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.backends.cuda

from . import memory
from .devices import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    NotSimulatedError,
    _state,
    another_gpu,
    asked_by_user,
    cuda_device,
)


class GPU:
    """The GPU the simulated one answers for, as ``torch.cuda.get_device_properties`` describes an A100."""

    name = "NVIDIA A100-SXM4-80GB"
    major, minor = 8, 0
    total_memory = 85_100_068_864
    multi_processor_count = 108
    L2_cache_size = 40 * 1024 * 1024
    is_integrated = is_multi_gpu_board = 0
    arch_list = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90")

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, multi_processor_count={self.multi_processor_count})"
        )


def _index(device: Any = None) -> int:
    """The index of the GPU ``device`` names (None, -1: the current one), as ``torch.cuda._get_device_index``."""
    if device is None:
        return _state.index
    if isinstance(device, str | torch.device):
        device = torch.device(device)
        if device.type not in ("cuda", DEVICE_TYPE):
            raise ValueError(f"Expected a cuda device, but got: {device}")
        index = _state.index if device.index is None else device.index
    else:
        index = int(device)
    if index < 0:
        return _state.index
    if index >= DEVICE_COUNT:
        raise AssertionError("Invalid device id")  # what torch.cuda says of an index past its GPUs
    return index


def own(device: Any, operation: str) -> None:
    """Refuse code of a DDP process that makes another process's GPU its own."""
    if _index(device) != _state.index:
        raise another_gpu(operation, _index(device))


class _DeviceContext:
    """``torch.cuda.device(d)``: GPU ``d`` must be the process's own (a class, as CUDA's, to be entered again)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __enter__(self) -> None:
        if self.device is not None:
            own(self.device, "torch.cuda.device")

    def __exit__(self, *exc_info: Any) -> None:
        pass


def _nothing(*args: Any, **kwargs: Any) -> None:
    """Nothing to do: the simulated GPU's work runs at once, and it caches no memory."""


class _Stream:
    """A CUDA stream of the simulated GPU: never anything to wait for."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = cuda_device(_index(device))
        self.priority = priority

    def query(self) -> bool:
        return True

    synchronize = wait_stream = wait_event = _nothing

    def record_event(self, event: Any = None) -> "_Event":
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device={self.device} (simulated)>"


class _Event:
    """A CUDA event of the simulated GPU: recorded at once, its times taken by the host's clock."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._at = time.perf_counter()

    def query(self) -> bool:
        return True

    wait = synchronize = _nothing

    def elapsed_time(self, end_event: "_Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._at is None or end_event._at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._at - self._at) * 1000.0


def _memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    mib = 1024 * 1024
    return (
        f"Simulated GPU {_index(device)} ({GPU.name}), its tensors' memory as CUDA's caching allocator counts it:\n"
        f"  allocated: {memory.allocated() / mib:.1f} MiB now, {memory.peak() / mib:.1f} MiB at most\n"
        f"  reserved (an estimate): {memory.reserved() / mib:.0f} MiB"
    )


def _of_any_gpu(answer: Callable[[], Any]) -> Callable[..., Any]:
    """A question about GPU ``device``: ``answer()``, alike for every GPU (an index past them is refused)."""

    def answered(device: Any = None) -> Any:
        _index(device)
        return answer()

    return answered


def _on_own(value: Callable[[], Any]) -> Callable[..., Any]:
    """A memory query: ``value()`` of the process's GPU, 0 of another (none of its tensors are there)."""

    def answer(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        return value() if _index(device) == _state.index else 0

    return answer


# torch.cuda's functions and the user's code's answers.
ANSWERS: dict[str, Callable[..., Any]] = {
    **dict.fromkeys(("is_available", "is_initialized", "is_tf32_supported"), lambda: True),
    **dict.fromkeys(
        (
            *("init", "empty_cache", "ipc_collect", "reset_accumulated_memory_stats", "set_stream"),
            *("manual_seed", "manual_seed_all", "seed", "seed_all", "set_sync_debug_mode"),
        ),
        _nothing,
    ),
    "device_count": lambda: DEVICE_COUNT,
    "current_device": lambda: _state.index,
    "set_device": lambda device: own(device, "torch.cuda.set_device"),
    "device": _DeviceContext,
    "device_of": lambda tensor: _DeviceContext(tensor.get_device() if tensor.get_device() >= 0 else None),
    "get_device_name": _of_any_gpu(lambda: GPU.name),
    "get_device_capability": _of_any_gpu(lambda: (GPU.major, GPU.minor)),
    "get_device_properties": _of_any_gpu(GPU),
    "get_arch_list": lambda: list(GPU.arch_list),
    "is_bf16_supported": lambda including_emulation=True: True,
    "can_device_access_peer": lambda device, peer_device: _index(device) >= 0 and _index(peer_device) >= 0,
    "synchronize": _of_any_gpu(lambda: None),
    "memory_allocated": _on_own(memory.allocated),
    "max_memory_allocated": _on_own(memory.peak),
    **dict.fromkeys(("memory_reserved", "memory_cached"), _on_own(lambda: memory.reserved(memory.allocated()))),
    **dict.fromkeys(("max_memory_reserved", "max_memory_cached"), _on_own(memory.reserved)),
    **dict.fromkeys(
        ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached"),
        lambda device=None: memory.reset_peak(),
    ),
    "mem_get_info": lambda device=None: (GPU.total_memory - _on_own(memory.reserved)(device), GPU.total_memory),
    "memory_stats": lambda device=None: memory.stats() if _index(device) == _state.index else {},
    "memory_summary": _memory_summary,
    "initial_seed": lambda: torch.initial_seed(),
    # Random numbers on the simulated GPU come from the CPU's generator.
    "get_rng_state": lambda device="cuda": torch.get_rng_state(),
    "set_rng_state": lambda state, device="cuda": torch.set_rng_state(state),
    "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(DEVICE_COUNT)],
    "set_rng_state_all": lambda states: torch.set_rng_state(list(states)[_state.index]),
    "Stream": _Stream,
    "Event": _Event,
    **dict.fromkeys(("current_stream", "default_stream"), lambda device=None: _Stream(device)),
    **dict.fromkeys(("stream", "StreamContext"), lambda stream=None: contextlib.nullcontext()),
    "is_current_stream_capturing": lambda: False,
    "get_sync_debug_mode": lambda: 0,
}
# torch.accelerator's functions: the current accelerator is CUDA's, with the same answers as torch.cuda's.
ACCELERATOR: dict[str, Callable[..., Any]] = {
    **{
        name: ANSWERS[name]
        for name in (
            *("device_count", "synchronize", "empty_cache", "current_stream", "set_stream", "memory_stats"),
            *("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"),
            *("reset_peak_memory_stats", "reset_accumulated_memory_stats"),
        )
    },
    "is_available": lambda check_available=False: True,
    "current_accelerator": lambda check_available=False: torch.device("cuda"),
    **dict.fromkeys(("current_device_index", "current_device_idx"), ANSWERS["current_device"]),
    **dict.fromkeys(
        ("set_device_index", "set_device_idx"), lambda device: own(device, "torch.accelerator.set_device_index")
    ),
    "device_index": _DeviceContext,
    "empty_host_cache": _nothing,
    "get_memory_info": ANSWERS["mem_get_info"],
}
# NVIDIA's profiler's markers: no profiler runs.
NVTX = {
    **dict.fromkeys(("range_push", "range_pop", "range_start", "range_end", "mark"), _nothing),
    "range": lambda *args, **kwargs: contextlib.nullcontext(),
}


def _refused(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulatedError(
            name, "the simulated GPU has no CUDA answer for it, so the code that calls it is not audited"
        )

    return refuse


def _told(original: Any, answer: Callable[..., Any]) -> Any:
    """``answer`` where the user's code calls, ``original`` where PyTorch or a library does."""
    if isinstance(original, type):
        return _ToldClass(original.__name__, (), {"_original": original, "_answer": staticmethod(answer)})

    @functools.wraps(original)
    def told(*args: Any, **kwargs: Any) -> Any:
        if asked_by_user():
            return answer(*args, **kwargs)
        return original(*args, **kwargs)

    return told


class _ToldClass(type):
    """A stand-in for ``torch.cuda``'s class ``_original``: ``_answer(...)`` for the user's code, else the class's."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if asked_by_user():
            return cls._answer(*args, **kwargs)
        return cls._original(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        answer = cls._answer
        return isinstance(instance, cls._original) or (isinstance(answer, type) and isinstance(instance, answer))


def _of_the_simulated_gpu(function: Callable[..., Any], position: int = 0, name: str = "device_type", default=False):
    """``function`` with its device type (argument ``position``, or ``name``) the simulated GPU's where it names
    CUDA; with ``default``, where none is given too (CUDA's, in their older forms)."""

    def simulated(device_type: Any) -> Any:
        return DEVICE_TYPE if device_type == "cuda" else device_type

    @functools.wraps(function)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position and isinstance(args[position], str):
            args = (*args[:position], simulated(args[position]), *args[position + 1 :])
        elif name in kwargs:
            kwargs[name] = simulated(kwargs[name])
        elif default:
            args = (*args[:position], DEVICE_TYPE, *args[position:])
        return function(*args, **kwargs)

    return mapped


# Autocast's and the gradient scaler's device types, for every caller: CUDA's autocast is the simulated GPU's.
_AUTOCAST = ("is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype")


def _answered(module: types.ModuleType, answers: dict[str, Callable[..., Any]]) -> list[tuple[Any, str, Any]]:
    """``(module, name, answer)`` for every public function of ``module`` (refused where ``answers`` has none) and
    each class ``answers`` has."""
    functions = {
        name
        for name in getattr(module, "__all__", ())
        if not name.startswith("_")
        and isinstance(getattr(module, name, None), types.FunctionType | types.BuiltinFunctionType)
    }
    refused = [(module, name, answers.get(name) or _refused(f"{module.__name__}.{name}")) for name in sorted(functions)]
    classes = [(module, name, answers[name]) for name in sorted(answers.keys() - functions) if hasattr(module, name)]
    return refused + classes


@contextlib.contextmanager
def replaced() -> Iterator[None]:
    """Inside the block, ``torch.cuda`` and ``torch.accelerator`` answer the user's code for the simulated GPU."""
    replacements = [*_answered(torch.cuda, ANSWERS), *_answered(torch.accelerator, ACCELERATOR)]
    replacements += [(torch.cuda.nvtx, name, answer) for name, answer in NVTX.items()]
    replacements.append((torch.backends.cuda, "is_built", lambda: True))  # asked to choose a GPU path
    told = [(module, name, _told(getattr(module, name), answer)) for module, name, answer in replacements]
    autocast, scaler, mode = torch.amp.autocast_mode.autocast, torch.amp.grad_scaler.GradScaler, torch.amp.autocast_mode
    told += [
        *((torch, name, _of_the_simulated_gpu(getattr(torch, name), default=True)) for name in _AUTOCAST),
        (autocast, "__init__", _of_the_simulated_gpu(autocast.__init__, 1)),
        (scaler, "__init__", _of_the_simulated_gpu(scaler.__init__, 1, "device", default=True)),
        (torch, "get_autocast_gpu_dtype", lambda: torch.get_autocast_dtype(DEVICE_TYPE)),
        (mode, "is_autocast_available", _of_the_simulated_gpu(mode.is_autocast_available)),
    ]
    with contextlib.ExitStack() as stack:
        for module, name, replacement in told:
            stack.enter_context(mock.patch.object(module, name, replacement))
        yield
