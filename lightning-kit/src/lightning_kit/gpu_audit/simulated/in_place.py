"""Parameters moved to and from the simulated GPU in place, as ``module.to(...)`` moves them on a GPU.

On a GPU a module's move gives each parameter its new values in place (``param.data = ...``): the same Python
object, with its attributes and hooks (``register_hook``, ``register_post_accumulate_grad_hook``). A simulated
tensor is another Python type, to which PyTorch would give a new Parameter instead, without those hooks. So while
simulating (``moves_in_place``), a module's move swaps each parameter's contents with its moved values
(``torch.utils.swap_tensors``, PyTorch's way for tensor subclasses), keeps its attributes and registers its hooks
again: the object stays the one the user's code, hooks and optimizers hold. A lazy module moves its own way
(``lazy.py``). Inside ``swaps_undone()`` every tensor swapped gets back, at the block's end, the contents it had
before its first swap (the audit gives the model back unchanged).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import torch
from torch.nn.parameter import is_lazy

_ledgers: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []  # each swaps_undone() block's, innermost last
_OWN = ("elem", "_is_param", "_made_before")  # what a simulated tensor's own __dict__ holds, not the user's
_SWAP = torch.utils.swap_tensors
_APPLY = torch.nn.Module._apply


def _swap(first: torch.Tensor, second: torch.Tensor) -> None:
    """Swap the two tensors' types, attributes and contents, each Python object staying where it is held."""
    try:
        _SWAP(first, second)
    except RuntimeError:
        # Referenced elsewhere (a weak reference, an autograd graph): the swap without PyTorch's check of references.
        first.__class__, second.__class__ = second.__class__, first.__class__
        first.__dict__, second.__dict__ = second.__dict__, first.__dict__
        torch._C._swap_tensor_impl(first, second)


def swap(first: torch.Tensor, second: torch.Tensor) -> None:
    """``first`` takes ``second``'s contents, keeping its own attributes and hooks; undone with the block's swaps."""
    attributes = {name: value for name, value in vars(first).items() if name not in _OWN}
    hooks, after = first._backward_hooks, first._post_accumulate_grad_hooks
    _swap(first, second)
    vars(first).update(attributes)
    # PyTorch keeps the hooks on the tensor's contents: registered again (the same dict: the user's handles work).
    if hooks is not None:
        first._backward_hooks = hooks
    if after is not None:
        first._post_accumulate_grad_hooks = after
    if _ledgers:
        _ledgers[-1].setdefault(id(first), (first, second))  # what it had before its first swap, in second


def _apply_in_place(module: torch.nn.Module, fn, recurse: bool = True):
    """``Module._apply`` (what ``.to``, ``.cpu``, ``.cuda``, ``.half`` run), swapping each parameter's contents."""
    if recurse:
        for child in module.children():
            child._apply(fn)
    lazy = any(is_lazy(param) for param in module._parameters.values())
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(not lazy)
    try:
        return _APPLY(module, fn, recurse=False)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


@contextmanager
def moves_in_place() -> Iterator[None]:
    """Inside the block, a module's move keeps its parameters' objects, attributes and hooks."""
    with (
        mock.patch.object(torch.nn.Module, "_apply", _apply_in_place),
        mock.patch.object(torch.utils, "swap_tensors", swap),
    ):
        yield


@contextmanager
def swaps_undone() -> Iterator[None]:
    """At the block's end, give each tensor swapped inside it (``swap``) the contents it had before."""
    ledger: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    _ledgers.append(ledger)
    try:
        yield
    finally:
        _ledgers.remove(ledger)
        for first, second in reversed(ledger.values()):
            _swap(first, second)
