"""Parameters moved to the simulated GPU in place, as ``module.to("cuda")`` moves them to a GPU.

On a GPU, moving a module gives each parameter its new values in place (``param.data = ...``): the
same Python object, with its attributes and the hooks registered on it (``register_hook``,
``register_post_accumulate_grad_hook``), which then run on the GPU's gradients. A tensor of the
simulated GPU is another Python type, which PyTorch would give a new Parameter object instead, without
those hooks. So ``move_parameters`` swaps each parameter's contents with its moved values
(``torch.utils.swap_tensors``), keeps its attributes, and registers its hooks again on the moved values;
the object stays the one the user's code and hooks hold.

Every swap made inside ``swaps_undone()`` (these moves, and a lazy parameter's materialisation) is undone
at the block's end, in reverse order: each parameter is again the object it was, with its values, its
gradient and its hooks as they were on the CPU (the audit trains the model itself and gives it back
unchanged).

Private PyTorch API: ``torch._C._swap_tensor_impl``, where ``swap_tensors`` refuses a tensor referenced
elsewhere (a weak reference, an autograd graph that still holds it): the swap is made the same way
without that check, since the audit gives those references up with the pass they belong to.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.parameter import Parameter, UninitializedTensorMixin

_ledgers: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # the swaps of each swaps_undone() block, innermost last
_OWN = ("elem", "_is_param")  # what a simulated tensor's own __dict__ holds, not the user's


def _swap(first: torch.Tensor, second: torch.Tensor) -> None:
    """Swap the two tensors' types, attributes and contents, keeping each Python object where it is held."""
    try:
        torch.utils.swap_tensors(first, second)
    except RuntimeError:  # referenced elsewhere: the same swap, without PyTorch's check of references
        first.__class__, second.__class__ = second.__class__, first.__class__
        first.__dict__, second.__dict__ = second.__dict__, first.__dict__
        torch._C._swap_tensor_impl(first, second)


def swap(first: torch.Tensor, second: torch.Tensor) -> None:
    """``first`` takes ``second``'s contents, keeping its own attributes and hooks; undone with the block's swaps."""
    attributes = {name: value for name, value in vars(first).items() if name not in _OWN}
    hooks, after = first._backward_hooks, first._post_accumulate_grad_hooks
    _swap(first, second)
    vars(first).update(attributes)
    # The hooks are kept on the tensor's contents inside PyTorch: registered again on the new ones (the same dict,
    # so that the user's handles still remove them).
    if hooks is not None:
        first._backward_hooks = hooks
    if after is not None:
        first._post_accumulate_grad_hooks = after
    if _ledgers:
        _ledgers[-1].append((first, second))


def move_parameters(module: torch.nn.Module, device: torch.device) -> None:
    """Give every parameter of ``module`` (not yet on ``device``) its values on ``device``, in place."""
    for child in module.modules():
        for param in child._parameters.values():
            if param is None or isinstance(param, UninitializedTensorMixin) or param.device == device:
                continue  # uninitialised parameters move their own way (lazy.py); shared ones once
            swap(param, Parameter(param.detach().to(device), requires_grad=param.requires_grad))


@contextmanager
def swaps_undone() -> Iterator[None]:
    """Undo, at the block's end, every swap made inside it (``swap``), the last first."""
    ledger: list[tuple[torch.Tensor, torch.Tensor]] = []
    _ledgers.append(ledger)
    try:
        yield
    finally:
        _ledgers.remove(ledger)
        for first, second in reversed(ledger):
            _swap(first, second)
