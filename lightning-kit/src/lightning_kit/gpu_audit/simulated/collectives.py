"""A process group for a simulated DDP rank: ``torch.distributed`` in this one process, with NCCL's device rules.

``process_group(1, 2)`` initializes ``torch.distributed`` as rank 1 of 2 with the backend ``simnccl``: every
collective first checks that every tensor is on this process's GPU, as NCCL does (else ``SimulatedDeviceError``),
then completes at once as if every process held the same values (a sum is ``world_size`` times the tensor, a
gather ``world_size`` copies). ``new_group`` groups are simulated too, ``gloo`` ones taking CPU tensors (Lightning
makes one around ``prepare_data``). The store is an in-memory ``HashStore``; no other process is waited for.
"""

import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NamedTuple
from unittest import mock

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

from .devices import DEVICE_TYPE, SimulatedDeviceError, as_cuda, current_device, users_line

BACKEND = "simnccl"  # NCCL's rule: tensors on this process's GPU only
HOST_BACKEND = "simgloo"  # Gloo's: CPU tensors too


class _Done(dist._Work):
    """A collective that has completed."""

    def __init__(self, result: Any = None) -> None:
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _flat(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def nccl_refusal(what: str, tensor: torch.Tensor, rank: int, **details: Any) -> SimulatedDeviceError:
    """NCCL's refusal of ``tensor`` in ``what``: it is off the GPU of process ``rank``."""
    device, gpu = as_cuda(tensor.device), as_cuda(current_device())
    return SimulatedDeviceError(
        f"{what} of a tensor on {device} in process {rank}, whose GPU is {gpu}: NCCL refuses it "
        f"(No backend type associated with device type {device.split(':')[0]})",
        devices=(gpu, device),
        culprit=tensor,
        **details,
    )


def _checked_only(operation: str, checked: int):
    """A collective whose result is in place already: it checks its first ``checked`` arguments alone."""

    def collective(self: "SimulatedProcessGroup", *args: Any, **kwargs: Any) -> _Done:
        self._checked(operation, *args[:checked])
        return _Done(args[0])

    return collective


class SimulatedProcessGroup(dist.ProcessGroup):
    """One rank of a DDP run on simulated GPUs: NCCL's device check, then the values every process would agree on."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: Any, backend: str = BACKEND) -> None:
        super().__init__(rank, world_size)
        self._world_size, self._backend = world_size, backend
        self._group_name = self._group_desc = ""

    # PyTorch's names for them; a process group with no C++ backend keeps its names itself.
    def getBackendName(self) -> str:  # noqa: N802
        return self._backend

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, description: str) -> None:  # noqa: N802
        self._group_desc = description

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    @property
    def _device_types(self) -> list[torch.device]:
        # Object collectives pickle onto the GPU with NCCL, onto the CPU with Gloo.
        return [torch.device(DEVICE_TYPE if self._backend == BACKEND else "cpu")]

    def _checked(self, operation: str, *tensors: Any) -> None:
        """Raise ``SimulatedDeviceError`` where NCCL would refuse a tensor: off this process's GPU."""
        note(operation, tensors, depth=2)
        gpu, name = current_device(), f"torch.distributed.{operation}"
        for tensor in _flat(tensors):
            if tensor.device != gpu and not (self._backend == HOST_BACKEND and tensor.device.type == "cpu"):
                raise nccl_refusal(name, tensor, self.rank(), kind="collective", operation=name, argument="tensor")

    def allreduce(self, tensors, opts=None):
        self._checked("all_reduce", tensors)
        if opts is not None and opts.reduceOp == dist.ReduceOp.SUM:
            for tensor in tensors:
                tensor.mul_(self._world_size)
        return _Done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        self._checked("all_gather", output_tensors, input_tensors)
        for outputs, tensor in zip(output_tensors, input_tensors, strict=True):
            for output in outputs:
                output.copy_(tensor)
        return _Done(output_tensors)

    def all_gather_single(self, output, tensor, opts=None):
        self._checked("all_gather_into_tensor", output, tensor)
        output.copy_(torch.cat([tensor.reshape(-1)] * self._world_size).reshape(output.shape))
        return _Done(output)

    def all_gather_single_coalesced(self, outputs, tensors, opts=None):
        for output, tensor in zip(outputs, tensors, strict=True):
            self.all_gather_single(output, tensor)
        return _Done(outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self._checked("reduce_scatter", output_tensors, input_tensors)
        for output, inputs in zip(output_tensors, input_tensors, strict=True):
            output.copy_(inputs[self.rank()])
        return _Done(output_tensors)

    def reduce_scatter_single(self, output, tensor, opts=None):
        self._checked("reduce_scatter_tensor", output, tensor)
        output.copy_(tensor.reshape(self._world_size, -1)[self.rank()].reshape(output.shape))
        return _Done(output)

    def reduce_scatter_single_coalesced(self, outputs, tensors, opts=None):
        for output, tensor in zip(outputs, tensors, strict=True):
            self.reduce_scatter_single(output, tensor)
        return _Done(outputs)

    def all_to_all_single(self, output, tensor, output_split_sizes=(), input_split_sizes=(), opts=None):
        self._checked("all_to_all_single", output, tensor)
        output.copy_(tensor.reshape(output.shape))
        return _Done(output)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._checked("all_to_all", output_tensors, input_tensors)
        for output, tensor in zip(output_tensors, input_tensors, strict=True):
            output.copy_(tensor)
        return _Done(output_tensors)

    reduce = _checked_only("reduce", 1)
    broadcast = _checked_only("broadcast", 1)
    gather = gather_single = _checked_only("gather", 2)
    scatter = _checked_only("scatter", 2)
    send = _checked_only("send", 1)
    recv = _checked_only("recv", 1)

    def recv_anysource(self, tensors, tag=0):
        return self.recv(tensors, 0, tag)

    allreduce_coalesced, allgather_coalesced = allreduce, allgather

    def barrier(self, opts=None):
        note("barrier", ())
        return _Done()

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        pass  # every simulated rank is here already


class Call(NamedTuple):
    """A collective this process called, while ``recorded``."""

    operation: str
    tensors: tuple[tuple[tuple[int, ...], str], ...]  # each tensor's shape and dtype
    line: tuple[str, int] | None  # of the user's code that called it (None: a library's own, as DDP's reducer)

    @property
    def signature(self) -> tuple:  # what the other process's matching call must have too
        return self.operation, self.tensors


_calls: list[Call] | None = None


@contextmanager
def recorded() -> Iterator[list[Call]]:
    """Inside the block, each collective this process calls is added to the list it gives."""
    global _calls
    calls, before = [], _calls
    _calls = calls
    try:
        yield calls
    finally:
        _calls = before


def note(operation: str, tensors: Any, depth: int = 1) -> None:
    """Record a collective called ``depth`` frames up (the caller's caller), inside ``recorded()``.

    Inside a function that gathers the sizes first and pads to the largest (``PADDED``), the shapes are not
    recorded: every process's are alike on GPUs, where this process gathers only its own sizes."""
    if _calls is not None:
        padded = _padding_gatherer(sys._getframe(depth + 1))
        shapes = tuple(
            ((-1,) * tensor.dim() if padded else tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
            for tensor in _flat(tensors)
        )
        _calls.append(Call(operation, shapes, users_line(depth + 1, through_libraries=True)))


# Functions that gather every process's sizes and pad to the largest before gathering the values.
PADDED = {
    "torch.distributed.distributed_c10d": {"all_gather_object", "gather_object", "broadcast_object_list"},
    "torchmetrics.utilities.distributed": {"gather_all_tensors"},
}


def _padding_gatherer(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_name in PADDED.get(frame.f_globals.get("__name__"), ()):
            return True
        frame = frame.f_back
    return False


def _new_group(original, ranks=None, timeout=None, backend=None, pg_options=None, *args: Any, **kwargs: Any):
    """``torch.distributed.new_group``, of a simulated backend: Gloo's rule for a ``gloo`` group, else NCCL's."""
    return original(ranks, timeout, HOST_BACKEND if "gloo" in str(backend).lower() else BACKEND, None, *args, **kwargs)


@contextmanager
def process_group(rank: int, world_size: int) -> Iterator[None]:
    """Inside the block, ``torch.distributed`` is initialized as rank ``rank`` of ``world_size`` on simulated GPUs
    (unless ``world_size`` is 1 or this process has a process group already)."""
    if world_size == 1 or not dist.is_available() or dist.is_initialized():
        yield
        return
    for backend, devices in ((BACKEND, [DEVICE_TYPE]), (HOST_BACKEND, ["cpu", DEVICE_TYPE])):
        if not hasattr(dist.Backend, backend.upper()):
            dist.Backend.register_backend(
                backend, functools.partial(SimulatedProcessGroup, backend=backend), devices=devices
            )
    new_group = functools.partial(_new_group, dist.new_group)
    with (
        mock.patch.dict(os.environ, {"TORCH_DIST_INIT_BARRIER": "0"}),
        mock.patch.object(dist, "new_group", new_group),
        mock.patch.object(dist.distributed_c10d, "new_group", new_group),
    ):
        dist.init_process_group(BACKEND, store=dist.HashStore(), rank=rank, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()
