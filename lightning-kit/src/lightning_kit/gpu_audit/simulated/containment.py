"""What stops the simulated GPU inside PyTorch's C++ comes back to Python: nothing it raises can end the process.

PyTorch calls the simulated GPU's Python code from C++ (``__torch_dispatch__``, its kernels, a user's backward
hooks). In a backward pass an exception there must not reach C++: the engine runs each node inside a stream
guard of the device, whose Python callback runs as it unwinds, and with the exception pending C++ calls
``std::terminate`` ("terminate called without an active exception"; tests/test_containment.py has each way
in). So there the first exception is kept (``keep``) and the entry point returns what the operation computes on
the CPU values inside, or ``STOP``, which C++ refuses with an error of its own that unwinds cleanly. The kept
exception is raised once back in Python (``raise_kept``): when the pass returns, at the next operation, or at
the end of ``simulating()``.
"""

import contextlib
import functools
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch

_kept: list[BaseException] = []  # the first exception of a backward pass, until raised in Python
_lock = threading.Lock()  # the engine may run a backward pass on a thread of its own

# The functions that start the engine's run of a backward pass: a kept exception's frames are those below them.
PASS_STARTS = {"_engine_run_backward", "_engine_run_checked"}


def in_backward() -> bool:
    """Whether the autograd engine is running a node of a backward pass on this thread."""
    return torch._C._current_autograd_node() is not None


def keep(err: BaseException) -> None:
    """Keep ``err``, if the first of this backward pass, to raise once back in Python.

    Records on it the Python frames inside the pass that called in (``_audit_stack``, from the caller's caller:
    a user's hook, where it was one) and the node being run (``_audit_backward_of``, e.g. ``"MmBackward0"``).
    """
    node = torch._C._current_autograd_node()
    err._audit_backward_of = node.name() if node is not None else None
    frame = sys._getframe(2)
    inside = []  # innermost first
    while frame is not None and frame.f_code.co_name not in PASS_STARTS:
        inside.append((frame, frame.f_lineno))
        frame = frame.f_back
    err._audit_stack = getattr(err, "_audit_stack", None) or traceback.StackSummary.extract(reversed(inside))
    with _lock:
        if not _kept:
            _kept.append(err)


def raise_kept() -> None:
    """Raise the exception kept during a backward pass, if any (outside one: inside, it is kept on)."""
    if _kept and not in_backward():
        with _lock:
            err = _kept[0] if _kept else None
            _kept.clear()
        if err is not None:
            raise err


def discard() -> None:
    """Forget the kept exception, if any, and the last one raised (see ``last_raised``)."""
    global _raised
    _raised = None
    with _lock:
        _kept.clear()


# The last exception an entry point raised outside a backward pass: TorchScript's interpreter turns it into a
# RuntimeError of its own that keeps neither it nor its message.
_raised: BaseException | None = None


def last_raised() -> BaseException | None:
    """The last exception the simulated GPU's entry points raised outside a backward pass, taken: once only."""
    global _raised
    err, _raised = _raised, None
    return err


class _Stop:
    """What an entry point returns to C++ where it can compute nothing: C++ refuses it, with its own error."""

    def __repr__(self) -> str:
        return "<the simulated GPU stopped this backward pass: its error is raised when the pass returns>"


STOP = _Stop()


def contained(benign: Callable[..., Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An entry point that C++ calls: in a backward pass, an exception is kept and ``benign(*args)`` returned
    (``STOP`` without one, or where it fails too).

    The entry point runs with torch function handling off: the checks on code (a TorchFunctionMode) are for the
    user's code, and in a backward pass they would otherwise see all of the simulated GPU's own work.
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def entry(*args: Any, **kwargs: Any) -> Any:
            global _raised
            backward = torch._C._current_autograd_node() is not None
            if _kept and not backward:
                raise_kept()  # back in Python after a backward pass that kept one
            try:
                with torch._C.DisableTorchFunction():
                    return function(*args, **kwargs)
            except BaseException as err:
                if not backward:
                    _raised = err
                    raise
                with contextlib.suppress(BaseException):  # nothing may leave for C++ here
                    keep(err)
                try:
                    return STOP if benign is None else benign(*args, **kwargs)
                except BaseException:  # the kept exception says what happened
                    return STOP

        return entry

    return decorate
