"""Operations PyTorch runs only on GPUs, computed here in CPU operations, so that the simulated GPU runs them too."""

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch._decomp

from .devices import NotSimulatedError

# The CPU's kernels: for dense tensors, sparse COO ones, and the compressed layouts (CSR, CSC, BSR, BSC). An
# operation of a sparse layout alone (the COO constructor an embedding's sparse gradient is made with) has
# only a sparse one.
_CPU_KEYS = ("CPU", "SparseCPU", "SparseCsrCPU")


@functools.cache
def _on_the_cpu(func) -> Callable[..., Any]:
    """``func``, or for an operation PyTorch runs only on GPUs, the same computation in CPU operations."""
    if func.namespace != "aten" or any(
        torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), key) for key in _CPU_KEYS
    ):
        return func
    if func in _GPU_ONLY:
        return _GPU_ONLY[func]
    if func in torch._decomp.decomposition_table:
        return torch._decomp.decomposition_table[func]
    return functools.partial(_not_simulated, func)


def _not_simulated(func, *args, **kwargs):
    raise NotSimulatedError(str(func), "it runs only on GPUs, and no CPU computation of it is known to simulate it")


# LSTM and GRU cells take fused kernels on every device but the CPU. The same arithmetic
# in CPU operations, with a workspace of our own layout that only our backward reads.
def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_cy = (torch.zeros_like(cy) if grad_cy is None else grad_cy) + grad_hy * o * (1 - tanh_cy**2)
    grad_gates = torch.cat(
        [
            grad_cy * g * i * (1 - i),
            grad_cy * cx * f * (1 - f),
            grad_cy * i * (1 - g**2),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        1,
    )
    return grad_gates, grad_cy * f, grad_gates.sum(0) if has_bias else None


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    (ir, ii, in_), (hr, hi, hn) = input_gates.chunk(3, 1), hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n**2)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input, grad_hidden = torch.cat([grad_r, grad_z, grad_n], 1), torch.cat([grad_r, grad_z, grad_n * r], 1)
    biases = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
    return grad_input, grad_hidden, grad_hy * z, *biases


_GPU_ONLY = {
    torch.ops.aten._thnn_fused_lstm_cell.default: _lstm_cell,
    torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default: _lstm_cell_backward,
    torch.ops.aten._thnn_fused_gru_cell.default: _gru_cell,
    torch.ops.aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward,
}
