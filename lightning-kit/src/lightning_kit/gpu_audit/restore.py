"""The model the audit trains is the user's own object (as Lightning trains it, never a copy), given back as found.

``as_found(model)`` notes before a pass what training changes, and puts it back after it, whatever stopped the pass:
every parameter, moved in place to and from the simulated GPU (``simulated/in_place.py``), is again the same object
with its CPU values, gradient, hooks and class; every submodule has its class again (a lazy module changes class
once materialised) and the attributes it had, with the dicts, lists and sets they held refilled in place; a plain
CPU tensor attribute changed in place has its values back. Python objects held deeper keep what the run did to them.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from . import simulated

_CONTAINERS = (dict, list, set)


@contextmanager
def as_found(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model`` may be trained on the simulated GPU; at its end it is as it was before."""
    modules = list(model.modules())
    classes = [type(module) for module in modules]
    attributes = [dict(vars(module)) for module in modules]
    held = [value for found in attributes for value in found.values()]
    containers = {id(value): (value, _shallow(value)) for value in held if isinstance(value, _CONTAINERS)}
    tensors = {id(value): (value, value.detach().clone()) for value in held if _plain_cpu(value)}
    held_tensors = [
        tensor
        for module in modules
        for tensor in (*module._parameters.values(), *module._buffers.values())
        if tensor is not None
    ]
    # A lazy module's uninitialised parameters are marked as on the device by their class (simulated/lazy.py); a
    # move clears a parameter's gradient before it swaps it.
    kinds = [(tensor, type(tensor)) for tensor in held_tensors]
    grads = [(tensor, tensor.grad) for tensor in held_tensors if tensor.grad is not None]
    try:
        with simulated.swaps_undone():
            yield
    finally:
        for tensor, kind in kinds:
            if type(tensor) is not kind:
                tensor.__class__ = kind
        for tensor, grad in grads:
            tensor.grad = grad
        for module, cls, found in zip(modules, classes, attributes, strict=True):
            if type(module) is not cls:
                module.__class__ = cls
            vars(module).clear()
            vars(module).update(found)
        for container, contents in containers.values():
            container.clear()
            if isinstance(container, list):
                container.extend(contents)
            else:
                container.update(contents)
        with torch.no_grad():
            for tensor, values in tensors.values():
                if (tensor.shape, tensor.dtype) == (values.shape, values.dtype) and not torch.equal(tensor, values):
                    tensor.copy_(values)


def _shallow(container: Any) -> Any:
    """What a dict, list or set holds, to refill it with."""
    return dict(container) if isinstance(container, dict) else list(container)


def _plain_cpu(value: Any) -> bool:
    """A CPU tensor with values of its own to put back: dense, a leaf, not a parameter (those are swapped back)."""
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and value.is_leaf
        and not isinstance(value, torch.nn.Parameter | torch.nn.parameter.UninitializedTensorMixin)
    )
