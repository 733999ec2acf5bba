"""A simulated GPU: real values computed on the CPU, CUDA's rules for where tensors may meet.

The device audit (``gpu_audit``) trains the model on this device. Everything a GPU run executes runs here too, with
real numbers; what differs is where the tensors are said to be: on ``simgpu:0`` (or ``simgpu:1``, to play a second
DDP process). An operation that mixes devices stops exactly where it would on a CUDA GPU, with CUDA's error message.

``simgpu`` is PyTorch's spare device type, PrivateUse1, renamed, with Python hooks (``backend``). A tensor on it is a
``SimulatedTensor`` holding a CPU tensor with the values; every operation on one reaches ``__torch_dispatch__``,
which checks its tensors' devices by CUDA's rules (``rules``), runs it on the CPU tensors inside and wraps the
results (``tensor``). Inside ``simulating()`` the simulated GPU is CUDA to the user's code (``cuda_api``,
``code_checks``), with CUDA's autocast policy (``autocast``) and deterministic-mode alerts (``deterministic``);
nothing raised inside PyTorch's C++ ends the process (``containment``). It imports nothing of Lightning, and of
the library only ``errors.first_line``.

The private and experimental PyTorch APIs it relies on, by file (tested with torch 2.13.0, the lowest declared, and
2.14.1; the library declares ``torch<2.15``):

- ``backend``: ``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` and its
  ``_DummyPrivateUse1Hook``; ``torch.library.Library.impl`` and ``.fallback`` for ``PrivateUse1`` and
  ``AutogradPrivateUse1``;
- ``tensor``: ``torch.Tensor._make_wrapper_subclass``, ``torch.utils._python_dispatch.return_and_correct_aliasing``,
  ``torch._C._InferenceMode``, ``OpOverload._schema``, ``OpOverload._op_dk``, ``OpOverload.decompose``;
- ``rules``: ``native_functions.yaml`` read as text, ``torch._C._dispatch_has_kernel_for_dispatch_key``;
- ``gpu_only``: ``torch._C._dispatch_has_computed_kernel_for_dispatch_key``, ``torch._decomp.decomposition_table``;
- ``containment``: ``torch._C.DisableTorchFunction``, ``torch._C._current_autograd_node``;
- ``autocast``: ``torch/include/ATen/autocast_mode.h`` read as text, the ``AutocastPrivateUse1`` key,
  ``torch._C._ExcludeDispatchKeyGuard``;
- ``collectives``: ``torch.distributed._Work``, a Python ``ProcessGroup`` (with the overrides of PyTorch's
  ``test_c10d_pypg.py``) and its ``_device_types``, ``Backend.register_backend``;
- ``lazy``: ``torch.nn.parameter.UninitializedTensorMixin``, ``torch._C._nn._parse_to``;
- ``in_place``: ``torch._C._swap_tensor_impl``, a tensor's ``_backward_hooks`` and ``_post_accumulate_grad_hooks``,
  ``torch.utils.swap_tensors`` and ``torch.nn.Module._apply``, replaced while simulating;
- ``devices``: ``torch._C._group_tensors_by_device_and_dtype`` and ``torch._C._accelerator_*``, replaced while
  simulating; ``code_checks``: ``torch.autograd._engine_run_backward``, ``BackwardHook.__init__`` and the
  ``_foreach_supported_types`` lists, replaced while simulating;
- ``memory``: a storage's Python object, kept by PyTorch while the storage lives, weakly referenced.
"""

from . import collectives, memory  # noqa: F401 (simulated.memory, simulated.collectives)
from .backend import enable
from .code_checks import forget_notes, made_at, named_cuda, simulating
from .containment import last_raised
from .deterministic import warned
from .devices import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    NotSimulatedError,
    SimulatedDeviceError,
    SimulationUnavailableError,
    as_cuda,
    cuda_device,
    current_device,
    device,
    set_device,
    told,
)
from .in_place import swaps_undone
from .tensor import SimulatedTensor, count_operations, to_cpu

__all__ = [
    "DEVICE_COUNT",
    "DEVICE_TYPE",
    "NotSimulatedError",
    "SimulatedDeviceError",
    "SimulatedTensor",
    "SimulationUnavailableError",
    "as_cuda",
    "count_operations",
    "cuda_device",
    "current_device",
    "device",
    "enable",
    "forget_notes",
    "last_raised",
    "made_at",
    "memory",
    "named_cuda",
    "set_device",
    "simulating",
    "swaps_undone",
    "to_cpu",
    "told",
    "warned",
]
