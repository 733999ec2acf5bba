"""The model the audit trains is the user's own object (never a copy), given back as found.

Parameters (moved in place: ``simulated/in_place.py``) keep their objects, CPU values, gradients and classes;
submodules get their classes (a lazy module changes class) and attributes back, with the dicts, lists and sets they
held refilled in place, and plain CPU tensor attributes their values. Python objects held deeper keep their changes.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from . import simulated


@contextmanager
def as_found(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model`` may be trained on the simulated GPU; at its end it is as it was before."""
    modules = list(model.modules())
    classes = [type(module) for module in modules]
    attributes = [dict(vars(module)) for module in modules]
    held = [value for found in attributes for value in found.values()]
    containers = {
        id(value): (value, dict(value) if isinstance(value, dict) else list(value))
        for value in held
        if isinstance(value, dict | list | set)
    }
    tensors = {id(value): (value, value.detach().clone()) for value in held if _plain_cpu(value)}
    held_tensors = [
        tensor
        for module in modules
        for tensor in (*module._parameters.values(), *module._buffers.values())
        if tensor is not None
    ]
    # A lazy parameter's class marks it as on the device (simulated/lazy.py); a move clears a gradient.
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


def _plain_cpu(value: Any) -> bool:
    """A dense CPU leaf tensor, not a parameter (those are swapped back), whose values to put back."""
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and value.is_leaf
        and not isinstance(value, torch.nn.Parameter | torch.nn.parameter.UninitializedTensorMixin)
    )
