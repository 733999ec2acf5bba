"""CUDA's rules for where an operation's tensors may be, read from PyTorch's own operator declarations.

Most operations require all tensors on one device; element-wise ones ("TensorIterator") also
accept 0-dim CPU tensors; indexing accepts CPU indices; copies and ``.to()`` cross devices. An
operation that CUDA runs as a composition of others is checked through those others.
"""

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from .devices import _CPU, SimulatedDeviceError, SimulationUnavailableError, as_cuda


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


def _mixed(func, first: torch.device, second: torch.device, argument: str | None, odd) -> SimulatedDeviceError:
    where = f" (when checking argument for argument {argument} in method wrapper_CUDA_{_kernel(func)})"
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


def _kernel(func) -> str:
    name, overload = func._schema.name.split("::")[-1], func._schema.overload_name
    return f"{name}_{overload}" if overload else f"_{name}"


def _named_tensors(func, args, kwargs) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(argument name, tensor, written to) for every tensor the operation takes, in schema order."""
    for position, argument in enumerate(func._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        is_output = argument.alias_info is not None and argument.alias_info.is_write
        values = value if isinstance(value, list | tuple) else (value,)
        for item in values:
            if isinstance(item, torch.Tensor):
                yield argument.name, item, is_output


_INDEXING = {"index.Tensor", "index.Tensor_out", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index.Tensor"}
_INDEXING |= {"_unsafe_index_put"}


def _rule(func) -> str:
    """How CUDA checks the devices of ``func``'s tensors: strict, iterator, index, any or composite."""
    schema = func._schema
    namespace, name = schema.name.split("::")
    key = f"{name}.{schema.overload_name}" if schema.overload_name else name
    if namespace != "aten":
        return "strict"  # a library's own kernel (torchvision, ...) checks its inputs
    if key in _INDEXING:
        return "index"
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
