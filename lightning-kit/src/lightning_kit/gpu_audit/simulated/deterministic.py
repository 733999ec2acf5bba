"""Deterministic mode as CUDA has it: the kernels that refuse to run, or warn, where the CPU's run.

Under ``torch.use_deterministic_algorithms(True)`` (``Trainer(deterministic=True)`` calls it; so may the
user's code, at any point) PyTorch makes the operations it can deterministic, and a kernel that has
no deterministic implementation calls ``Context::alertNotDeterministic`` (``aten/src/ATen/Context.cpp``):
a ``RuntimeError`` naming the kernel, or with ``warn_only=True`` (``deterministic="warn"``) a
warning. Many of those kernels are CUDA's alone (atomic adds in backward passes): the CPU runs the
same model deterministically and says nothing. ``ALERTS`` holds CUDA's, each with the condition its
kernel checks, read from PyTorch's CUDA sources (``aten/src/ATen/native/cuda``); the flag is read as
it stands at each operation. PyTorch's Python layer routes some operations to deterministic
decompositions on CUDA (``torch.nn.functional``'s bilinear and trilinear interpolation, replicate
padding, 3-d max pooling): the simulated GPU is CUDA to that module, so they take those routes as on
a GPU. Since PyTorch 2.9 cuBLAS needs no ``CUBLAS_WORKSPACE_CONFIG`` in deterministic mode
(pytorch/pytorch#161749): matmuls are not alerts.

``tests/test_deterministic.py`` holds ``ALERTS`` against the list in the installed PyTorch's
``torch.use_deterministic_algorithms`` documentation.
"""

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .devices import SimulatedDeviceError, users_line

# What CUDA's kernel raises, with the kernel's name for ``{kernel}`` (Context::alertNotDeterministic).
ERROR = (
    "{kernel} does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'. "
    "You can turn off determinism just for this operation, or you can use the 'warn_only=True' option, if that's "
    "acceptable for your application. You can also file an issue at https://github.com/pytorch/pytorch/issues to "
    "help us prioritize adding deterministic support for this operation."
)
WARNING = (
    "{kernel} does not have a deterministic implementation, but you set "
    "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
    "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic support for this operation."
)

_Condition = Callable[[dict[str, Any]], bool] | None


def _reduces(arguments: dict[str, Any]) -> bool:
    return arguments.get("reduction", 1) != 0  # Reduction::None is 0


def _cudnn_ctc(arguments: dict[str, Any]) -> bool:
    """Whether CUDA's ctc_loss would have taken cuDNN's deterministic path (LossCTC.cpp, _use_cudnn_ctc_loss)."""
    targets, log_probs = arguments.get("targets"), arguments.get("log_probs")
    return (
        isinstance(targets, torch.Tensor)
        and isinstance(log_probs, torch.Tensor)
        and targets.device.type == "cpu"
        and targets.dim() == 1
        and targets.dtype == torch.int32
        and log_probs.dtype == torch.float32
        and arguments.get("blank") == 0
        and max(arguments.get("target_lengths") or [0]) <= 256
        and torch.backends.cudnn.enabled
    )


def _cudnn_grid_sample(arguments: dict[str, Any]) -> bool:
    """Whether CUDA's grid_sampler would have taken cuDNN's path (GridSampler.cpp, cond_cudnn_grid_sampler)."""
    source = arguments.get("input")
    return (
        torch.backends.cudnn.enabled
        and isinstance(source, torch.Tensor)
        and source.dim() == 4
        and source.shape[1] <= 1024
        and arguments.get("interpolation_mode") == 0  # bilinear
        and arguments.get("padding_mode") == 0  # zeros
        and arguments.get("align_corners") is True
    )


# By aten operation (every overload, unless one is named): CUDA's name for the kernel, and when it alerts (always
# where None). From aten/src/ATen/native/cuda/*.cu and the device-generic TensorAdvancedIndexing.cpp (put_).
ALERTS: dict[str, tuple[str, _Condition]] = {
    "_adaptive_avg_pool2d_backward": ("adaptive_avg_pool2d_backward_cuda", None),  # not a 1x1 output: a mean
    "_adaptive_avg_pool3d_backward": ("adaptive_avg_pool3d_backward_cuda", None),
    "adaptive_avg_pool3d_backward": ("adaptive_avg_pool3d_backward_out_cuda", None),
    "adaptive_max_pool2d_backward": ("adaptive_max_pool2d_backward_cuda", None),
    "avg_pool3d_backward": ("avg_pool3d_backward_cuda", None),
    "max_pool3d_with_indices_backward": ("max_pool3d_with_indices_backward_cuda", None),
    "fractional_max_pool2d_backward": ("fractional_max_pool2d_backward_cuda", None),
    "fractional_max_pool3d_backward": ("fractional_max_pool3d_backward_cuda", None),
    "max_unpool2d": ("max_unpooling2d_forward_out", None),
    "max_unpool3d": ("max_unpooling3d_forward_out", None),
    "upsample_linear1d_backward": ("upsample_linear1d_backward_out_cuda", None),
    "upsample_bilinear2d_backward": ("upsample_bilinear2d_backward_out_cuda", None),
    "_upsample_bilinear2d_aa_backward": ("upsample_bilinear2d_aa_backward_out_cuda", None),
    "upsample_bicubic2d_backward": ("upsample_bicubic2d_backward_out_cuda", None),
    "_upsample_bicubic2d_aa_backward": ("upsample_bicubic2d_aa_backward_out_cuda", None),
    "upsample_trilinear3d_backward": ("upsample_trilinear3d_backward_out_cuda", None),
    "reflection_pad1d_backward": ("reflection_pad1d_backward_out_cuda", None),
    "reflection_pad3d_backward": ("reflection_pad3d_backward_out_cuda", None),
    "replication_pad1d_backward": ("replication_pad1d_backward_cuda", None),
    "replication_pad2d_backward": ("replication_pad2d_backward_cuda", None),
    "replication_pad3d_backward": ("replication_pad3d_backward_cuda", None),
    "nll_loss2d_forward": ("nll_loss2d_forward_out_cuda_template", _reduces),  # atomicAdd in 'sum' and 'mean'
    "_ctc_loss_backward": ("ctc_loss_backward_gpu", lambda arguments: not _cudnn_ctc(arguments)),
    "_embedding_bag_dense_backward": ("embedding_bag_backward_cuda_max", lambda arguments: arguments["mode"] == 2),
    "grid_sampler_2d_backward": ("grid_sampler_2d_backward_cuda", lambda arguments: not _cudnn_grid_sample(arguments)),
    "grid_sampler_3d_backward": ("grid_sampler_3d_backward_cuda", None),
    "median.dim": ("median CUDA with indices output", None),
    "median.dim_values": ("median CUDA with indices output", None),
    "nanmedian.dim": ("median CUDA with indices output", None),
    "nanmedian.dim_values": ("median CUDA with indices output", None),
    "bincount": ("_bincount_cuda", lambda arguments: arguments.get("weights") is not None),
    "histc": ("_histc_cuda with floating point input", lambda arguments: arguments["self"].is_floating_point()),
    # scatter with a tensor src, and scatter_reduce's sum and mean, take index_put's deterministic path on CUDA.
    "scatter.reduce": ("scatter_reduce_cuda_kernel", lambda arguments: arguments["reduce"] == "multiply"),
    "scatter_.reduce": ("scatter_reduce_cuda_kernel", lambda arguments: arguments["reduce"] == "multiply"),
    "scatter.reduce_out": ("scatter_reduce_cuda_kernel", lambda arguments: arguments["reduce"] == "multiply"),
    "scatter_reduce.two": ("scatter_reduce_cuda_prod_", lambda arguments: arguments["reduce"] == "prod"),
    "scatter_reduce_.two": ("scatter_reduce_cuda_prod_", lambda arguments: arguments["reduce"] == "prod"),
    "scatter_reduce.two_out": ("scatter_reduce_cuda_prod_", lambda arguments: arguments["reduce"] == "prod"),
    "index_reduce": ("index_reduce_cuda", None),
    "index_reduce_": ("index_reduce_cuda", None),
    "put_": ("put_", None),  # on CUDA whether it accumulates or not (on the CPU only where it does not)
    "put": ("put_", None),
}


def _forward_of(backward: str) -> str | None:
    """The forward operation whose backward is the operation ``backward`` (``upsample_bilinear2d_backward``:
    ``upsample_bilinear2d``), or None for an operation that is no backward."""
    for suffix in ("_dense_backward", "_backward"):
        if backward.endswith(suffix):
            return backward.removesuffix(suffix)
    return None


# The forward operations whose backward CUDA refuses in deterministic mode.
_FORWARDS = {_forward_of(name) for name in ALERTS} - {None}


class Alert:
    """The alert of one operation's CUDA kernel: ``check(args, kwargs)`` raises or warns as CUDA would; for a forward
    operation whose backward has one (no ``kernel``), it notes the user's line that ran it.

    A backward pass runs in no line of the user's code: the line is the one that ran its forward operation (the
    last before the backward pass; ``_forward_lines``), where the operation would be changed."""

    __slots__ = ("condition", "forward", "func", "kernel", "names")

    def __init__(self, func, kernel: str | None, condition: _Condition, forward: str | None) -> None:
        self.func, self.kernel, self.condition, self.forward = func, kernel, condition, forward
        self.names = [argument.name for argument in func._schema.arguments]

    def check(self, args: tuple, kwargs: dict) -> None:
        if not torch.are_deterministic_algorithms_enabled():
            return
        if self.kernel is None:
            line = users_line(2, through_libraries=True)  # a layer's forward: the model's line that called it
            if line is not None:
                _forward_lines[self.forward] = line
            return
        if self.condition is not None and not self.condition({**dict(zip(self.names, args, strict=False)), **kwargs}):
            return
        forward_line = _forward_lines.get(self.forward)
        if torch.is_deterministic_algorithms_warn_only_enabled():
            _warned.setdefault(users_line(2) or forward_line, self.kernel)
            warnings.warn(WARNING.format(kernel=self.kernel), UserWarning, stacklevel=2)
            return
        error = SimulatedDeviceError(ERROR.format(kernel=self.kernel), kind="deterministic", operation=str(self.func))
        error.forward_line = forward_line  # where a backward pass has no line of the user's code (explain.py)
        raise error


def alert_of(func) -> Alert | None:
    """The alert of ``func``'s CUDA kernel in deterministic mode (or, for a forward operation whose backward has
    one, what notes its line), or None."""
    if func.namespace != "aten":
        return None
    name = func._schema.name.split("::")[-1]
    found = ALERTS.get(f"{name}.{func._overloadname}") or ALERTS.get(name)
    if found is not None:
        return Alert(func, *found, forward=_forward_of(name))
    return Alert(func, None, None, forward=name) if name in _FORWARDS else None


_warned: dict[tuple[str, int] | None, str] = {}  # each line (None: unknown) warned at, and its kernel
_forward_lines: dict[str | None, tuple[str, int]] = {}  # by forward operation, the user's line that last ran it


def warned() -> list[tuple[tuple[str, int] | None, str]]:
    """Where deterministic mode's ``warn_only`` warned, and of which kernel, since ``forget_warned``."""
    return list(_warned.items())


def forget_warned() -> None:
    _warned.clear()
    _forward_lines.clear()
