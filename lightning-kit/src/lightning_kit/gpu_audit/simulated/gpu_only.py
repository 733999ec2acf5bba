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


# LSTM and GRU cells take fused kernels on every device but the CPU (RNN.cpp, LSTMCell and GRUCell). The same
# arithmetic in CPU operations; registered for the simulated GPU's autograd key too (backend.py), so that autograd
# differentiates it: the fused kernels' backward, which reads the workspace, is never called.
def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, gates


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    (ir, ii, in_), (hr, hi, hn) = input_gates.chunk(3, 1), hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


FUSED_CELLS = {"_thnn_fused_lstm_cell": _lstm_cell, "_thnn_fused_gru_cell": _gru_cell}
_GPU_ONLY = {getattr(torch.ops.aten, name).default: cell for name, cell in FUSED_CELLS.items()}
