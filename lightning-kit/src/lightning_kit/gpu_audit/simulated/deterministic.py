"""Deterministic mode as CUDA has it: the kernels that refuse to run, or warn, where the CPU's run.

Under ``torch.use_deterministic_algorithms(True)`` (``Trainer(deterministic=True)``, or the user's code) a kernel
with no deterministic implementation raises (``Context::alertNotDeterministic``), or warns with
``warn_only=True``. Many are CUDA's alone (atomic adds in backward passes): ``ALERTS`` holds them, each with the
condition its kernel checks (``aten/src/ATen/native/cuda``). ``torch.nn.functional`` routes some operations to
deterministic decompositions on CUDA, and the simulated GPU is CUDA to it. Since PyTorch 2.9 cuBLAS needs no
``CUBLAS_WORKSPACE_CONFIG`` (pytorch/pytorch#161749): matmuls are not alerts. ``tests/test_deterministic.py``
holds ``ALERTS`` against the installed PyTorch's documentation.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .devices import SimulatedDeviceError, users_line
from .rules import given

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
    # atomicAdd in 'sum' and 'mean' (Reduction::None is 0)
    "nll_loss2d_forward": (
        "nll_loss2d_forward_out_cuda_template",
        lambda arguments: arguments.get("reduction", 1) != 0,
    ),
    "_ctc_loss_backward": ("ctc_loss_backward_gpu", lambda arguments: not _cudnn_ctc(arguments)),
    **dict.fromkeys(  # the simulated GPU sees the first; CUDA's kernel is the second's
        ("_embedding_bag_backward", "_embedding_bag_dense_backward"),
        ("embedding_bag_backward_cuda_max", lambda arguments: arguments["mode"] == 2 and not arguments.get("sparse")),
    ),
    "grid_sampler_2d_backward": ("grid_sampler_2d_backward_cuda", lambda arguments: not _cudnn_grid_sample(arguments)),
    "grid_sampler_3d_backward": ("grid_sampler_3d_backward_cuda", None),
    **dict.fromkeys(
        ("median.dim", "median.dim_values", "nanmedian.dim", "nanmedian.dim_values"),
        ("median CUDA with indices output", None),
    ),
    "bincount": ("_bincount_cuda", lambda arguments: arguments.get("weights") is not None),
    "histc": ("_histc_cuda with floating point input", lambda arguments: arguments["self"].is_floating_point()),
    # scatter with a tensor src, and scatter_reduce's sum and mean, take index_put's deterministic path on CUDA.
    **dict.fromkeys(
        ("scatter.reduce", "scatter_.reduce", "scatter.reduce_out"),
        ("scatter_reduce_cuda_kernel", lambda arguments: arguments["reduce"] == "multiply"),
    ),
    **dict.fromkeys(
        ("scatter_reduce.two", "scatter_reduce_.two", "scatter_reduce.two_out"),
        ("scatter_reduce_cuda_prod_", lambda arguments: arguments["reduce"] == "prod"),
    ),
    **dict.fromkeys(("index_reduce", "index_reduce_"), ("index_reduce_cuda", None)),
    # on CUDA whether it accumulates or not (on the CPU only where it does not)
    **dict.fromkeys(("put_", "put"), ("put_", None)),
}


def _forward_of(backward: str) -> str | None:
    """The forward operation of a backward one (``upsample_bilinear2d`` of ``upsample_bilinear2d_backward``)."""
    return backward.removesuffix("_backward").removesuffix("_dense") if backward.endswith("_backward") else None


_FORWARDS = {_forward_of(name) for name in ALERTS} - {None}  # those whose backward CUDA refuses


@dataclass(slots=True)
class Alert:
    """The alert of one operation's CUDA kernel: ``check(args, kwargs)`` raises or warns as CUDA would.

    For a forward operation whose backward has one (no ``kernel``), it notes the user's line that ran it: a
    backward pass runs in no line of the user's code, and that line is where the operation would be changed."""

    func: Any
    kernel: str | None
    condition: _Condition
    forward: str | None

    def check(self, args: tuple, kwargs: dict) -> None:
        if not torch.are_deterministic_algorithms_enabled():
            return
        if self.kernel is None:
            line = users_line(2, through_libraries=True)  # a layer's forward: the model's line that called it
            if line is not None:
                _forward_lines[self.forward] = line
            return
        arguments = given(self.func, args, kwargs)
        if self.condition is not None and not self.condition({argument.name: value for argument, value in arguments}):
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
    """The alert of ``func``'s CUDA kernel (or, for a forward operation whose backward has one, its note), or None."""
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
    """Where deterministic mode's ``warn_only`` warned, and of which kernel, since ``forget_notes``."""
    return list(_warned.items())
