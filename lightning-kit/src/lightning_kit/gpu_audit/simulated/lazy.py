"""Uninitialised parameters and buffers (``nn.LazyLinear``, ...) on the simulated GPU.

On a GPU, moving a module moves its uninitialised parameters too: they stay uninitialised and materialise there
at the first forward pass. Moved like an ordinary tensor, one would become an empty tensor on the simulated GPU.
So while simulating, its move to the simulated GPU keeps it uninitialised, in place, marked as on the current
device; its ``materialize`` makes the values there and gives the parameter those contents in place
(``in_place.swap``), so that the module and an optimizer made before keep the same object. Moving it back to the
CPU takes the mark off.
"""

import functools

import torch
from torch.nn.parameter import Parameter, UninitializedTensorMixin

from .devices import DEVICE_TYPE, _state, current_device, told
from .in_place import swap


class _OnSimulatedGPU:
    """An uninitialised parameter or buffer on the simulated GPU: it materialises there."""

    @property
    def device(self) -> torch.device:
        return told(current_device())

    def get_device(self) -> int:
        return _state.index

    def materialize(self, shape, device=None, dtype=None) -> None:
        """Make the values on the simulated GPU (or on ``device``), with this tensor's dtype unless given."""
        base = _base(type(self))
        device = current_device() if device is None else device
        data = torch.empty(shape, device=device, dtype=self.data.dtype if dtype is None else dtype)
        if issubclass(base.cls_to_become, Parameter):
            made = Parameter(data, requires_grad=self.requires_grad)
        else:
            made = data.requires_grad_(self.requires_grad)
            vars(made).update({name: vars(self)[name] for name in ("persistent", "_is_buffer") if name in vars(self)})
        swap(self, made)


@functools.cache
def _marked(base: type) -> type:
    """``base`` (``UninitializedParameter``, ``UninitializedBuffer``, ...) on the simulated GPU."""
    return type(base.__name__, (_OnSimulatedGPU, base), {"__module__": base.__module__})


def _base(cls: type) -> type:
    """The class of PyTorch's that ``cls`` marks."""
    return next(base for base in cls.__mro__ if base is not cls and issubclass(base, UninitializedTensorMixin))


def moved(tensor: torch.Tensor, args, kwargs) -> torch.Tensor | None:
    """``tensor.to(*args, **kwargs)`` of an uninitialised tensor between the CPU and the simulated GPU, in place;
    None where the move is another (to a dtype only, say): that one runs as PyTorch runs it."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    if device is None or device.type not in (DEVICE_TYPE, "cpu"):
        return None
    if dtype is not None and dtype != tensor.data.dtype:
        tensor.data = torch.empty(0, dtype=dtype)
    marked = isinstance(tensor, _OnSimulatedGPU)
    if device.type == DEVICE_TYPE and not marked:
        tensor.__class__ = _marked(type(tensor))
    elif device.type == "cpu" and marked:
        tensor.__class__ = _base(type(tensor))
    return tensor
