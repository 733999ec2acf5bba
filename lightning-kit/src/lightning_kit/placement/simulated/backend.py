"""The ``simgpu`` device type: PyTorch's spare device type, PrivateUse1, renamed, with Python hooks.

Allocations on ``simgpu`` with no tensor of it involved (``torch.zeros(..., device=...)``,
``batch.to(device)``) come through kernels registered here for PrivateUse1.
"""

import functools
from typing import Any

import torch

from . import autocast
from .devices import DEVICE_COUNT, DEVICE_TYPE, SimulationUnavailableError, _state, set_device
from .rules import _declared_rules, composite_kernels
from .tensor import SimulatedTensor, _run

_PACKAGE = __name__.rpartition(".")[0]  # <pkg>.placement.simulated


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
    autocast.register(library, fallback)
    for name, kernel in composite_kernels():  # where PyTorch decomposes them: its autograd key
        library.impl(name, kernel, "AutogradPrivateUse1")
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
            f"{_PACKAGE}.enable() first (in tests, lightning_kit's pytest plugin does, unless -p no:lightning_kit "
            f"turns it off), or audit in a process of its own (python -m {_PACKAGE.rpartition('.')[0]}, or a "
            "project's python -m <package>.placement)"
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
