"""The ``simgpu`` device type: PyTorch's spare device type, PrivateUse1, renamed, with Python hooks.

Allocations on ``simgpu`` with no tensor of it involved (``torch.zeros(..., device=...)``, ``batch.to(device)``)
come through kernels registered here for PrivateUse1.
"""

import functools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.backend_registration import _DummyPrivateUse1Hook, _setup_privateuseone_for_python_backend

from . import autocast
from .containment import contained
from .devices import _SIMULATED, DEVICE_COUNT, DEVICE_TYPE, SimulationUnavailableError, _state, set_device
from .gpu_only import FUSED_CELLS
from .rules import _declared_rules, composite_kernels
from .tensor import SimulatedTensor, _run


@contextmanager
def _on_device(device: Any) -> Iterator[None]:
    """``with torch.simgpu.device(i):``"""
    previous = _state.index
    set_device(device)
    try:
        yield
    finally:
        _state.index = previous


# ``torch.simgpu``: what PyTorch and Lightning ask of a device module. Random numbers on the simulated GPU come from
# the CPU's default generator, so its state is the device's (activation checkpointing saves and restores it).
_BACKEND = types.SimpleNamespace(
    is_available=lambda: False,  # the audit's alone: else DataLoader(pin_memory=True) would pin memory for it
    is_initialized=lambda: True,
    device_count=lambda: DEVICE_COUNT,
    current_device=lambda: _state.index,
    set_device=set_device,
    device=_on_device,
    _is_in_bad_fork=lambda: False,
    _initialized=True,
    manual_seed=lambda seed: None,
    manual_seed_all=lambda seed: None,
    get_rng_state=lambda device=None: torch.get_rng_state(),
    set_rng_state=lambda state, device=None: torch.set_rng_state(state),
    get_amp_supported_dtype=lambda: [torch.float16, torch.bfloat16],
    synchronize=lambda device=None: None,  # operations run at once: there is nothing to wait for
)


class _Hooks(_DummyPrivateUse1Hook):
    """With no primary context, the autograd engine keeps no stream of the device to restore after a backward
    pass: a restore that calls Python from C++ code that must not raise (it aborts the process)."""

    def has_primary_context(self, dev_id: int) -> bool:
        return False


def enable() -> None:
    """Register the ``simgpu`` device type in this process: once (a call after one that failed starts again), at
    any time: the simulated GPU's backward passes run on the thread that starts them (``simulating()``), so the
    autograd engine's count of devices, made at the process's first backward pass, does not matter."""
    if _libraries:
        return
    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", DEVICE_TYPE):
        raise SimulationUnavailableError(f"PyTorch's spare device type is already taken by {taken!r} in this process")
    if taken == "privateuseone":
        _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_BACKEND, hook=_Hooks())
    _SIMULATED[:] = [torch.device(DEVICE_TYPE, index) for index in range(DEVICE_COUNT)]
    _state.physical = _SIMULATED[0]
    _declared_rules()
    library = torch.library.Library("aten", "IMPL")
    fallback = torch.library.Library("_", "IMPL")
    try:
        for name, kernel in (
            ("empty.memory_format", functools.partial(_fallback, torch.ops.aten.empty.memory_format)),
            ("empty_strided", functools.partial(_fallback, torch.ops.aten.empty_strided.default)),
            ("copy_", _copy),
            ("_copy_from", _copy_from),
            ("_copy_from_and_resize", _copy_from),
            ("_local_scalar_dense", _local_scalar_dense),
        ):
            library.impl(name, kernel, "PrivateUse1")
        fallback.fallback(_fallback, dispatch_key="PrivateUse1")
        autocast.register(library, fallback)
        for name, kernel in [*composite_kernels(), *FUSED_CELLS.items()]:  # where PyTorch decomposes them
            library.impl(name, contained()(kernel), "AutogradPrivateUse1")
    except BaseException:
        for registered in (library, fallback):
            registered._destroy()  # so that a later call registers them anew
        raise
    _libraries.extend((library, fallback))  # a library unregisters its kernels when collected


_libraries: list[torch.library.Library] = []


@contained()
def _fallback(op, *args, **kwargs):
    """An operation that makes tensors on the simulated device from no tensor of it: run it on the CPU."""
    return _run(op, args, kwargs)


@contained()
def _copy(self, src, non_blocking: bool = False):
    self.elem.copy_(src.elem if isinstance(src, SimulatedTensor) else src)
    return self


# torch.tensor([a, b]) (torch.as_tensor, x.new_tensor, ...) of 0-dim GPU tensors reads each value on the host below
# PyTorch's Python key: here (PyTorch stopped at an internal assertion without this kernel).
@contained()
def _local_scalar_dense(self):
    return self.elem.item()


@contained()
def _copy_from(self, dst, non_blocking: bool = False):
    _copy(dst, self)
    return dst
