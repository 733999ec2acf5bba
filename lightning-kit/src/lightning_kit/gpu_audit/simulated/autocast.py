"""Autocast on the simulated GPU, with CUDA's casting policy, read from the header PyTorch builds it from.

``torch.autocast("simgpu", ...)`` (and Lightning's ``16-mixed``/``bf16-mixed`` on this device) casts the same
operations to the same dtypes as CUDA's: the ``AutocastPrivateUse1`` dispatch key gets a kernel with the policy
of each operation in CUDA's op lists (``torch/include/ATen/autocast_mode.h``, the ``_LISTS`` macros, plus those
``autocast_mode.cpp`` names for CUDA: ``_EXTRA``), and a fallthrough for every other. The casts happen above
autograd, as CUDA's do, so backward sees them, and a dtype mismatch CUDA would refuse is refused here too.
"""

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

from .containment import contained
from .devices import DEVICE_TYPE, SimulatedDeviceError, SimulationUnavailableError
from .rules import _overload

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_LISTS = {
    "AT_FORALL_LOWER_PRECISION_FP": "lower_precision_fp",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
    "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE": "fp32_append_dtype",
    "AT_FORALL_PROMOTE": "promote",
}
# What autocast_mode.cpp registers for CUDA beside the shared lists (torch 2.13 to 2.14).
_EXTRA = {
    "cudnn_convolution": "lower_precision_fp",
    "cudnn_convolution_transpose": "lower_precision_fp",
    "_cudnn_rnn": "lower_precision_fp",
    "linalg_matrix_sqrth": "fp32",  # a decomposition, kept in float32 as AutocastCPU keeps linalg
    "binary_cross_entropy": "banned",
}
BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


@functools.cache
def cuda_policies() -> dict[str, str]:
    """CUDA's autocast policy of each aten operation it casts (``"linear"``, ``"pow.Scalar"``, ...)."""
    if not HEADER.is_file():
        raise SimulationUnavailableError(f"{HEADER} is missing: this PyTorch does not ship its autocast op lists")
    text = HEADER.read_text(encoding="utf-8")
    policies = {}
    for macro, policy in _LISTS.items():
        block = re.search(rf"#define {macro}\(_\)((?:.*\\\n)*.*)", text)
        if block is None:
            raise SimulationUnavailableError(f"{HEADER} has no {macro}: this PyTorch's autocast lists are unknown")
        body = block.group(1)
        if policy == "fp32_append_dtype":
            names = re.findall(r'"([\w.]+)"', body)
        else:
            entries = re.findall(r"_\(([^()]*)\)", body)  # _(op) or _(op, overload)
            names = [".".join(part.strip() for part in entry.split(",")) for entry in entries]
        policies.update(dict.fromkeys(names, policy))
    return {**policies, **_EXTRA}


def register(library: torch.library.Library, fallback: torch.library.Library) -> None:
    """Give ``AutocastPrivateUse1`` CUDA's kernels: a cast for each operation CUDA casts, a fallthrough elsewhere."""
    fallback.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    for name, policy in cuda_policies().items():
        op = _overload(name)
        if op is not None:  # in this PyTorch
            library.impl(name, contained()(functools.partial(_KERNELS[policy], op)), "AutocastPrivateUse1")


def _eligible(value: Any) -> bool:
    """A floating-point tensor on the simulated GPU, not float64: what CUDA's autocast casts."""
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == DEVICE_TYPE
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


def _redispatch(op, args, kwargs):
    """``op`` below the autocast key, as CUDA's kernels call it."""
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
        return op(*args, **kwargs)


def _cast_all(dtype_of: Callable[[tuple, dict], torch.dtype], op, *args, **kwargs):
    dtype = dtype_of(args, kwargs)
    args, kwargs = tree_map_only(torch.Tensor, lambda t: t.to(dtype) if _eligible(t) else t, (args, kwargs))
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
        return op(*args, **kwargs) if dtype == torch.float32 else _in_float32(op, dtype, args, kwargs)


# The CPU's float16 and bfloat16 kernels are slow (a convolution, forward and backward, 17 times float32's): an
# operation cast to the lower precision is computed in float32 and its results rounded, as a GPU's tensor cores
# accumulate in float32. Autograd sees CUDA's dtypes; only the arithmetic inside is wider.
def _in_float32(op, dtype: torch.dtype, args, kwargs):
    flat, spec = tree_flatten((args, kwargs))
    positions = [i for i, value in enumerate(flat) if isinstance(value, torch.Tensor) and value.dtype == dtype]
    if not positions or any(isinstance(value, torch.Tensor) and value.dtype == torch.float64 for value in flat):
        return op(*args, **kwargs)
    tensors = [flat[i] for i in positions]
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors):
        return _Float32.apply(op, spec, flat, positions, dtype, *tensors)
    return _rounded(_call(op, spec, flat, positions, [tensor.float() for tensor in tensors]), dtype)


def _call(op, spec, flat, positions, tensors):
    flat = list(flat)
    for position, tensor in zip(positions, tensors, strict=True):
        flat[position] = tensor
    args, kwargs = tree_unflatten(flat, spec)
    return op(*args, **kwargs)


def _rounded(out, dtype: torch.dtype):
    return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, out)


class _Float32(torch.autograd.Function):
    """``op`` computed in float32 on lower-precision inputs; its results and gradients rounded back."""

    @staticmethod
    def forward(ctx, op, spec, flat, positions, dtype, *tensors):
        with torch.enable_grad():
            ctx.inputs = [tensor.detach().float().requires_grad_(tensor.requires_grad) for tensor in tensors]
            out = _call(op, spec, flat, positions, ctx.inputs)
        ctx.outputs = out if isinstance(out, tuple) else (out,)
        ctx.dtypes = [tensor.dtype for tensor in tensors]
        rounded = tuple(_rounded(output.detach(), dtype) for output in ctx.outputs)
        ctx.mark_non_differentiable(*(output for output in rounded if not output.is_floating_point()))
        return rounded if isinstance(out, tuple) else rounded[0]

    @staticmethod
    def backward(ctx, *grads):
        pairs = [
            (output, grad.float())
            for output, grad in zip(ctx.outputs, grads, strict=True)
            if grad is not None and output.requires_grad
        ]
        wanted = [tensor for tensor in ctx.inputs if tensor.requires_grad]
        found = iter(
            torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
            if pairs
            else [None] * len(wanted)
        )
        results = [next(found) if tensor.requires_grad else None for tensor in ctx.inputs]
        return (None,) * 5 + tuple(
            None if result is None else result.to(dtype) for result, dtype in zip(results, ctx.dtypes, strict=True)
        )


def _promote_type(args, kwargs) -> torch.dtype:
    """The widest floating dtype among the eligible tensors: float32 if any is, else the lower precision."""
    found = [t for t in tree_leaves((args, kwargs)) if _eligible(t)]
    return torch.float32 if any(t.dtype == torch.float32 for t in found) else torch.get_autocast_dtype(DEVICE_TYPE)


def _fp32_set_opt_dtype(op, *args, **kwargs):
    """softmax, sum, ...: in float32 unless a dtype was given, when the input is eligible."""
    first = next((value for value in args if isinstance(value, torch.Tensor)), None)
    if _eligible(first):
        position = [argument.name for argument in op._schema.arguments].index("dtype")
        if position < len(args):
            if args[position] is None:
                args = (*args[:position], torch.float32, *args[position + 1 :])
        elif kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
    return _redispatch(op, args, kwargs)


def _fp32_append_dtype(op, *args, **kwargs):
    """norm without a dtype: redispatched to its overload that takes one, float32 for an eligible input."""
    dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
    return _redispatch(_with_dtype(op), args, {**kwargs, "dtype": dtype})


@functools.cache
def _with_dtype(op):
    """The overload of ``op`` that takes the same arguments followed by a ``dtype``."""
    wanted = [argument.name for argument in op._schema.arguments] + ["dtype"]
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1])
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if [argument.name for argument in candidate._schema.arguments] == wanted:
            return candidate
    raise SimulationUnavailableError(f"{op} has no overload with a dtype in this PyTorch")


def _banned(op, *args, **kwargs):
    raise SimulatedDeviceError(BANNED, kind="autocast", operation=str(op))


_KERNELS = {
    "lower_precision_fp": functools.partial(_cast_all, lambda args, kwargs: torch.get_autocast_dtype(DEVICE_TYPE)),
    "fp32": functools.partial(_cast_all, lambda args, kwargs: torch.float32),
    "promote": functools.partial(_cast_all, _promote_type),
    "fp32_set_opt_dtype": _fp32_set_opt_dtype,
    "fp32_append_dtype": _fp32_append_dtype,
    "banned": _banned,
}
