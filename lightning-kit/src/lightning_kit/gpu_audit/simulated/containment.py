"""What stops the simulated GPU inside PyTorch's C++ comes back to Python: nothing it raises can end the process.

PyTorch calls the simulated GPU's Python code from C++: ``__torch_dispatch__`` for every operation
on its tensors, the kernels it registers (allocations, copies, autocast, composite operations),
and, through the operations of a user's backward hooks, its checks on code. In the forward pass
an exception there travels back to Python as usual. In a backward pass it does not: the autograd
engine runs each node inside a stream guard of the device, and the guard of a Python device calls
back into Python as it unwinds; with the exception still pending there, C++ calls
``std::terminate`` ("terminate called without an active exception", SIGABRT). A host gradient
given to ``torch.autograd.grad`` was enough (tests/test_containment.py has each way in).

So during a backward pass (``torch._C._current_autograd_node()`` is set) those entry points do not
raise: the first exception is kept (``keep``), with the Python code that called in (a user's hook)
and the node being run, and the operation returns what it computes on the values inside, which are
all on the CPU, so that the hook and the engine go on. Where nothing can be computed, the entry
point returns ``STOP``, which C++ refuses with an error of its own that unwinds cleanly. The kept
exception is raised in Python as soon as control is back there outside the backward pass
(``raise_kept``): when ``backward()`` or ``torch.autograd.grad`` returns, at the next operation,
or at the end of ``simulating()``. What a GPU would refuse is then reported at the user's line:
the hook's where it was in one, else the line that started the backward pass.
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


# The functions that start the autograd engine's run of a backward pass, from Python: the frames of a kept
# exception's ``_audit_stack`` are those inside the pass, below them.
PASS_STARTS = {"_engine_run_backward", "_engine_run_checked"}


def in_backward() -> bool:
    """Whether the autograd engine is running a node of a backward pass on this thread."""
    return torch._C._current_autograd_node() is not None


def keep(err: BaseException) -> None:
    """Keep ``err`` (the first of this backward pass) to raise once back in Python.

    Records on it the Python code, inside the backward pass, that called into the simulated GPU
    (``_audit_stack``, from the caller's caller: a user's hook, where it was one; none where the engine
    called in from C++) and the node being run (``_audit_backward_of``, e.g. ``"MmBackward0"``).
    """
    node = torch._C._current_autograd_node()
    err._audit_backward_of = node.name() if node is not None else None
    frame = sys._getframe(2)
    inside = []  # the frames running inside the backward pass, innermost first: not those that started it
    while frame is not None and frame.f_code.co_name not in PASS_STARTS:
        inside.append((frame, frame.f_lineno))
        frame = frame.f_back
    err._audit_stack = getattr(err, "_audit_stack", None) or traceback.StackSummary.extract(reversed(inside))
    with _lock:
        if not _kept:
            _kept.append(err)


def pending() -> bool:
    return bool(_kept)


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
    _raised[0] = None
    with _lock:
        _kept.clear()


# The last exception an entry point raised outside a backward pass. Where TorchScript's interpreter runs the
# operation, it turns the exception into a RuntimeError of its own that keeps neither the exception nor its
# message ("The following operation failed in the TorchScript interpreter. ... RuntimeError: "): this is
# what it was.
_raised: list[BaseException | None] = [None]


def last_raised() -> BaseException | None:
    """The last exception the simulated GPU's entry points raised outside a backward pass, taken: once only."""
    err, _raised[0] = _raised[0], None
    return err


class _Stop:
    """What an entry point returns to C++ where it can compute nothing: C++ refuses it, with its own error."""

    def __repr__(self) -> str:
        return "<the simulated GPU stopped this backward pass: its error is raised when the pass returns>"


STOP = _Stop()


# The simulated GPU's own code, run where C++ calls in, with no torch function handling: the checks on code
# (``code_checks._CodeChecks``, a TorchFunctionMode) are for the user's code, and in a backward pass, which runs
# with them on so that the user's hooks are checked, they would otherwise see every size, stride and
# operation of the simulated GPU's own work (several Python calls an operation, twice its cost).
_OWN_CODE = torch._C.DisableTorchFunction


def contained(benign: Callable[..., Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An entry point that C++ calls: in a backward pass, an exception is kept and ``benign(*args)`` returned.

    ``benign`` computes what the operation computes regardless of devices; without one, or where it
    fails too, ``STOP`` is returned.
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def entry(*args: Any, **kwargs: Any) -> Any:
            backward = torch._C._current_autograd_node() is not None
            if _kept and not backward:
                raise_kept()  # back in Python after a backward pass that kept one
            try:
                with _OWN_CODE():
                    return function(*args, **kwargs)
            except BaseException as err:
                if not backward:
                    _raised[0] = err  # where C++ keeps only its message, or none (see last_raised)
                    raise
                # Nothing may leave for C++ here: it is raised later.
                with contextlib.suppress(BaseException):  # keeping it must not raise either
                    keep(err)
                if benign is None:
                    return STOP
                try:
                    return benign(*args, **kwargs)
                except BaseException:  # the kept exception says what happened
                    return STOP

        return entry

    return decorate
