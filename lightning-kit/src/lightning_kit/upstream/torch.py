"""PyTorch's private names the library relies on (the simulated GPU's live with it)."""

from types import FunctionType

from torch._ops import OpOverload
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from . import Private

PRIVATES = (
    Private(
        "torch._ops.OpOverload",
        "the class of an ATen operation in an exported graph: a served model file may call nothing else",
        "torch 2.13.0 to 2.14.1",
        lambda: OpOverload,
        type,
    ),
    Private(
        "torch.utils._pytree.tree_unflatten",
        "an exported program's inputs and outputs, nested as its call_spec says (PyTorch has no public pytree)",
        "torch 2.13.0 to 2.14.1",
        lambda: tree_unflatten,
        FunctionType,
    ),
    Private(
        "torch.utils._pytree.tree_leaves",
        "the names of an exported program's inputs, in the order its call_spec takes them",
        "torch 2.13.0 to 2.14.1",
        lambda: tree_leaves,
        FunctionType,
    ),
    Private(
        "torch.utils._pytree.tree_flatten",
        "the tensors among an operation's operands, wherever they nest, for the explanation of a failure",
        "torch 2.13.0 to 2.14.1",
        lambda: tree_flatten,
        FunctionType,
    ),
)


def is_aten_operation(target) -> bool:
    """Whether an exported graph's node calls an ATen operation (an overload of ``torch.ops.aten``)."""
    return isinstance(target, OpOverload) and target.namespace == "aten"
