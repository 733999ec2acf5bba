"""A second opinion from PyTorch itself: code run on FakeTensor's CUDA device, which needs no GPU.

``torch._subclasses.fake_tensor.FakeTensorMode`` makes tensors that have a device, a shape and a
dtype but no values, CUDA ones included on a machine without CUDA, and propagates devices by
PyTorch's own rules for it (``FakeTensor._find_common_device``): an operation on tensors of two
devices raises ``FakeTensorDeviceMismatchError``, except for 0-dim CPU tensors, which it lets meet
any device. Those rules were written apart from the simulated GPU's (``gpu_audit/simulated/rules.py``,
read from ``native_functions.yaml``), so where the two agree on a rule's wrong and right code, each
checks the other; where they disagree, one of them is wrong about CUDA, and the test that compares them
(tests/test_fake_tensor_agreement.py) names the PyTorch source that decides.

``on_fake_cuda(run)`` calls ``run(device)`` inside the mode, with ``device`` its CUDA device, and
says what came of it: ``OK``, ``REFUSED`` (a device mismatch: FakeTensor's own, or one of PyTorch's
checks that compare devices), or ``CANNOT_EXPRESS`` (what FakeTensor cannot run without values:
``.item()``, ``nonzero``, data-dependent shapes, operators without a fake kernel, NumPy, and what
needs a real CUDA: cuDNN's checks, CUDA generators). On a machine without a CUDA driver the
autograd engine cannot run a backward pass of FakeTensor's CUDA tensors (it finds no stream for
the device): ``backward(loss)`` then says so, and a run that passed its forward pass is
``FORWARD_OK``, which settles a rule whose wrong code fails in the forward pass only.

Private and experimental PyTorch API, used by the tests alone (tested with torch 2.14.1):
``torch._subclasses.fake_tensor.FakeTensorMode`` (``allow_non_fake_inputs=True``, so that CPU
tensors made outside it take part as CPU tensors), its exceptions
``FakeTensorDeviceMismatchError``, ``DataDependentOutputException``, ``DynamicOutputShapeException``,
``UnsupportedOperatorException``, and ``torch.fx.experimental.symbolic_shapes``'s
``GuardOnDataDependentSymNode``.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_kit.errors import first_line

OK, FORWARD_OK, REFUSED, CANNOT_EXPRESS = "ok", "ok (forward)", "refused", "cannot express"
# PyTorch's own checks that compare devices, as they word it (an LSTM's hidden state, ...), and those of
# arguments read on the host (tensor_split's points, randint_like's bound, a packed sequence's lengths).
_DEVICE_CHECK = re.compile(
    r"same device|device.*\bcuda\b.*\bcpu\b|device.*\bcpu\b.*\bcuda\b|to be on cpu, but it's on|"
    r"scalar tensor and on CPU|should be a 1D CPU",
    re.IGNORECASE,
)
# The autograd engine's assertion where FakeTensor's CUDA device has no streams to run a backward pass on:
# a machine without a CUDA driver (engine.cpp, Engine::evaluate_function / InputBuffer streams).
_NO_BACKWARD = re.compile(r"opt_ready_stream && opt_parent_stream|hasPrimaryContext expects a valid device")


@dataclass(frozen=True)
class FakeVerdict:
    """What FakeTensor made of a run: ``OK``, ``REFUSED`` or ``CANNOT_EXPRESS``, and its first line."""

    outcome: str
    message: str = ""

    def __str__(self) -> str:
        return self.outcome if not self.message else f"{self.outcome}: {self.message}"


def backward(loss: torch.Tensor) -> bool:
    """``loss.backward()`` on FakeTensor's CUDA device; False where this machine cannot run one (no CUDA driver:
    the engine then has no streams for the device), so that the run is judged by its forward pass."""
    try:
        loss.backward()
    except RuntimeError as err:
        if _NO_BACKWARD.search(str(err)):
            return False
        raise
    return True


def on_fake_cuda(run: Callable[[torch.device], Any]) -> FakeVerdict:
    """``run(device)`` with FakeTensor's CUDA device; what came of it (see the module's docstring).

    ``run`` returns False where it ran the forward pass only (``backward`` said no): ``FORWARD_OK``.
    """
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorDeviceMismatchError,
        FakeTensorMode,
        UnsupportedOperatorException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    cannot = (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
        GuardOnDataDependentSymNode,
    )
    try:
        # Backward passes on the thread that starts them, as the simulated GPU's (the engine's device
        # threads may not serve a fake CUDA device in a process without one).
        with FakeTensorMode(allow_non_fake_inputs=True), torch.autograd.set_multithreading_enabled(False):
            whole = run(torch.device("cuda"))
    except FakeTensorDeviceMismatchError as err:
        return FakeVerdict(REFUSED, first_line(err))
    except cannot as err:
        return FakeVerdict(CANNOT_EXPRESS, first_line(err, typed=True))
    except (RuntimeError, TypeError, ValueError, NotImplementedError, AssertionError) as err:
        chain = _chain(err)
        if any(isinstance(link, FakeTensorDeviceMismatchError) for link in chain):
            return FakeVerdict(REFUSED, first_line(err))
        if any(isinstance(link, cannot) for link in chain):
            return FakeVerdict(CANNOT_EXPRESS, first_line(err, typed=True))
        if _DEVICE_CHECK.search(str(err)):
            return FakeVerdict(REFUSED, first_line(err))
        if _NO_BACKWARD.search(str(err)):
            return FakeVerdict(CANNOT_EXPRESS, "a backward pass on FakeTensor's CUDA device needs a CUDA driver")
        return FakeVerdict(CANNOT_EXPRESS, first_line(err, typed=True))
    return FakeVerdict(FORWARD_OK) if whole is False else FakeVerdict(OK)


def _chain(err: BaseException) -> list[BaseException]:
    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain
