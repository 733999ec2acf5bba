"""CUDA's rules for where an operation's tensors may be, read from PyTorch's own operator declarations.

Most operations require all tensors on one device; element-wise ones ("TensorIterator") also accept 0-dim CPU
tensors; indexing accepts CPU indices; copies and ``.to()`` cross devices; a composite operation is checked
through its parts. Some arguments CUDA reads on the host must be CPU tensors (``HOST_ARGUMENTS``).
"""

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from .devices import _CPU, SimulatedDeviceError, SimulationUnavailableError, as_cuda, legacy_type


def _check_devices(func, rule: str, args, kwargs) -> None:
    """Raise ``SimulatedDeviceError`` where a CUDA kernel would refuse this mix of devices."""
    if rule == "any":
        return
    common = first = None  # the device the operation runs on, and the tensor that decided it
    for name, tensor, is_output in _named_tensors(func, args, kwargs):
        device = tensor.device
        if rule == "index" and name == "indices":
            continue  # checked below, once the indexed tensor's device is known
        if rule in ("iterator", "index") and device.type == "cpu" and tensor.dim() == 0 and not is_output:
            continue  # a CPU scalar: TensorIterator reads it as a number
        if common is None:
            common, first = device, (name, tensor)
        elif device != common:
            odd = first if common.type == "cpu" else (name, tensor)
            raise _mixed(func, common, device, name if rule == "strict" else None, odd)
    if rule == "index" and common is not None:
        for name, tensor, _ in _named_tensors(func, args, kwargs):
            if name == "indices" and tensor.device not in (common, _CPU):
                raise SimulatedDeviceError(
                    f"indices should be either on cpu or on the same device as the indexed tensor ({as_cuda(common)})",
                    kind="mixed devices",
                    operation=str(func),
                    devices=(as_cuda(common), as_cuda(tensor.device)),
                    argument=name,
                    culprit=tensor,
                )


# Convolutions check their input's type against their weight's and bias's before anything else, on CUDA as on the
# CPU (Convolution.cpp, check_input_same_type_as_parameters): a CPU weight is that error, whatever the kernel.
CONVOLUTIONS = {"convolution", "_convolution", "convolution_overrideable", "conv_tbc"}


def mixed_operands(func, args, kwargs) -> SimulatedDeviceError | None:
    """The error CUDA gives an operation of the device's tensors given a CPU tensor of more than 0 dims too, or None.

    For an operation run as CUDA composes it: whatever part of it would fail, CUDA refuses the mix first.
    """
    named = list(_named_tensors(func, args, kwargs))
    device = next((tensor.device for _, tensor, _ in named if tensor.device.type != "cpu"), None)
    odd = next(((name, tensor) for name, tensor, _ in named if tensor.device.type == "cpu" and tensor.dim() > 0), None)
    if device is None or odd is None:
        return None
    name, tensor = odd
    if func._schema.name.split("::")[-1] in CONVOLUTIONS and name in ("input", "weight", "bias"):
        given = next((tensor for argument, tensor, _ in named if argument == "input"), None)
        if given is not None:
            other = tensor if name != "input" else next(t for a, t, _ in named if a == "weight")
            what = name if name != "input" else "weight"
            return SimulatedDeviceError(
                f"Input type ({legacy_type(given)}) and {what} type ({legacy_type(other)}) should be the same or "
                "input should be a MKLDNN tensor and weight is a dense tensor",
                kind="mixed devices",
                operation=str(func),
                devices=(as_cuda(device), "cpu"),
                argument=name,
                culprit=tensor,
            )
    return _mixed(func, device, tensor.device, name, odd)


def _mixed(func, first: torch.device, second: torch.device, argument: str | None, odd) -> SimulatedDeviceError:
    name, overload = func._schema.name.split("::")[-1], func._schema.overload_name
    kernel = f"{name}_{overload}" if overload else f"_{name}"
    where = f" (when checking argument for argument {argument} in method wrapper_CUDA_{kernel})"
    odd_name, odd_tensor = odd
    return SimulatedDeviceError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{as_cuda(first)} and {as_cuda(second)}!" + (where if argument else ""),
        kind="mixed devices",
        operation=str(func),
        devices=(as_cuda(first), as_cuda(second)) if odd_tensor.device == second else (as_cuda(second), as_cuda(first)),
        argument=odd_name,
        culprit=odd_tensor,
    )


def _named_tensors(func, args, kwargs) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(argument name, tensor, written to) for every tensor the operation takes on the device, in schema order."""
    on_host = _host_arguments().get(func, {})
    for argument, value in given(func, args, kwargs):
        if argument.name in on_host:
            continue  # read on the host: checked by check_host_arguments
        is_output = argument.alias_info is not None and argument.alias_info.is_write
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, torch.Tensor):
                yield argument.name, item, is_output


def given(func, args, kwargs) -> Iterator[tuple[torch._C.Argument, object]]:
    """Each argument of ``func``'s schema, with the value given for it (None where none is)."""
    for position, argument in enumerate(func._schema.arguments):
        yield argument, args[position] if position < len(args) else kwargs.get(argument.name)


_INDEXING = {
    "index.Tensor",
    "index.Tensor_out",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "_unsafe_index.Tensor",
    "_unsafe_index_put",
}


def _rule(func) -> str:
    """How CUDA checks the devices of ``func``'s tensors: strict, iterator, index, any, composite or implicit."""
    schema = func._schema
    namespace, name = schema.name.split("::")
    key = f"{name}.{schema.overload_name}" if schema.overload_name else name
    if namespace != "aten":
        return "strict"  # a library's own kernel (torchvision, ...) checks its inputs
    if key in _INDEXING:
        return "index"
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # Autograd's key decomposes it; under inference mode it reaches the simulated tensors whole.
        return "implicit"
    return _declared_rules().get(key, "strict")


@functools.cache
def _declared_rules() -> dict[str, str]:
    """Each aten operation's device check, read from the declarations PyTorch generates its kernels from."""
    import torchgen

    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if not path.is_file():
        raise SimulationUnavailableError(f"{path} is missing: this PyTorch does not ship its operator declarations")
    rules = {}
    for entry in re.split(r"\n(?=- func:)", path.read_text(encoding="utf-8")):
        declared = re.match(r"- func: ([\w.]+)\(", entry)
        if declared is None:
            continue
        check = re.search(r"device_check: NoCheck(.*)", entry)
        dispatch = set(re.findall(r"^ {4}([\w, ]+):", entry, flags=re.MULTILINE))
        backends = {key.strip() for line in dispatch for key in line.split(",")}
        if check is not None:
            comment = check.group(1)
            rules[declared.group(1)] = (
                "iterator" if re.search("TensorIterator|foreach|_index_put_impl_", comment) else "any"
            )
        elif "structured_delegate" not in entry and "CUDA" not in backends and "CompositeExplicitAutograd" in backends:
            rules[declared.group(1)] = "composite"
    return rules


# Arguments that CUDA kernels read on the host, with the message of the check that refuses a GPU tensor. From
# PyTorch's sources (torch 2.13 to 2.14, aten/src/ATen/native/): of the operations that take lengths, sizes,
# offsets or bounds as tensors, the others read them on the device, copy them to the host themselves, or run
# on GPUs only. tests/test_host_arguments.py has a wrong and a right version of each.
_PACKED = "'lengths' argument should be a 1D CPU int64 tensor, but got {dim}D {device} {dtype} tensor"  # for each
HOST_ARGUMENTS = {
    "_pack_padded_sequence": {"lengths": _PACKED},  # PackedSequence.cpp, checkLongTensor
    "_pad_packed_sequence": {"batch_sizes": _PACKED},  # PackedSequence.cpp, checkLongTensor
    "_pack_padded_sequence_backward": {"batch_sizes": _PACKED},  # PackedSequence.cpp, checkLongTensor
    # RNN.cpp (and cudnn/RNN.cpp): a packed sequence's batch sizes are read through data_ptr on the host, unchecked
    **{
        key: {"batch_sizes": "a packed sequence's batch_sizes must be a CPU int64 tensor, not on {device}"}
        for key in ("lstm.data", "gru.data", "rnn_tanh.data", "rnn_relu.data")
    },
    "tensor_split.tensor_indices_or_sections": {  # TensorShape.cpp
        "tensor_indices_or_sections": "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on "
        "{device}"
    },
    "randint_like.Tensor": {"high": "high must be a scalar tensor and on CPU"},  # TensorFactories.cpp
}


def _by_operation(table: dict) -> dict:
    """``table`` by the operations this PyTorch has: {OpOverload: value}."""
    return {func: value for key, value in table.items() if (func := _overload(key)) is not None}


@functools.cache
def _host_arguments() -> dict:
    return _by_operation(HOST_ARGUMENTS)


def _overload(key: str):
    """The aten operation named ``key`` (``name.overload``), or None where this PyTorch has none."""
    name, _, overload = key.partition(".")
    packet, overload = getattr(torch.ops.aten, name, None), overload or "default"
    return getattr(packet, overload) if packet is not None and overload in packet.overloads() else None


def check_host_arguments(func, args, kwargs) -> None:
    """Raise ``SimulatedDeviceError`` where ``func`` is given a GPU tensor for an argument CUDA reads on the host."""
    arguments = _host_arguments().get(func, {})
    for argument, tensor in given(func, args, kwargs):
        if argument.name in arguments and isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
            device = as_cuda(tensor.device)
            dtype = legacy_type(tensor).rpartition(".")[2].removesuffix("Tensor")  # Long, Float, ...
            raise SimulatedDeviceError(
                arguments[argument.name].format(argument=argument.name, dim=tensor.dim(), device=device, dtype=dtype),
                kind="host tensor",
                operation=str(func),
                devices=("cpu", device),
                argument=argument.name,
                culprit=tensor,
            )


# ctc_loss with tensor lengths takes, for tensor subclasses, a path that CUDA never takes for its own tensors
# (LossCTC.cpp, at::areAnyTensorSubclassLike): CUDA copies the lengths to the host and moves the targets to
# log_probs' device itself. ATen's other branches on tensor subclasses keep the same devices.
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1, zero_infinity=False):
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    lengths = input_lengths.tolist(), target_lengths.tolist()
    return torch.ops.aten.ctc_loss.IntList(log_probs, targets, *lengths, blank, reduction, zero_infinity)


CUDA_PATHS = {"ctc_loss.Tensor": _ctc_loss}


@functools.cache
def cuda_paths() -> dict:
    return _by_operation(CUDA_PATHS)


def as_on_cuda(func, *args, **kwargs):
    """A composite operation computed as CUDA computes it: its host arguments checked, then CUDA's path or its parts."""
    check_host_arguments(func, args, kwargs)
    path = cuda_paths().get(func)
    return path(*args, **kwargs) if path is not None else func.decompose(*args, **kwargs)


def composite_kernels() -> list[tuple[str, object]]:
    """The composite operations whose path or host checks differ on the simulated GPU, as (name, kernel), for its
    autograd key, where PyTorch decomposes them."""
    return [
        (key, functools.partial(as_on_cuda, func))
        for key in sorted({*HOST_ARGUMENTS, *CUDA_PATHS})
        if (func := _overload(key)) is not None
        and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    ]
