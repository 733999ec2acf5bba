"""While simulating: what the autograd engine calls back into, checked as CUDA's engine checks it.

The user's tensor and module backward hooks and custom ``torch.autograd.Function`` backwards run inside a backward
pass, called from C++: what they raise is kept (``containment``) and raised when the pass returns, and a gradient
they give on another device than the one it replaces is refused as CUDA refuses it (PyTorch skips those checks for
tensor subclasses, as the simulated GPU's tensors are).
"""

import functools
import linecache
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.hooks import BackwardHook

from .containment import in_backward, keep
from .devices import SimulatedDeviceError, as_cuda, legacy_type, users_line


def _contained_hook(hook):
    """``hook``, whose exceptions are kept, and a gradient it returns on another device than the one it was given
    refused at its line, as CUDA refuses it (python_hook.cpp, check_single_result)."""

    @functools.wraps(hook)
    def run(*args, **kwargs):
        try:
            result = hook(*args, **kwargs)
            _check_hook_result(hook, args, result)
        except BaseException as err:  # an exception left for the engine would end the process
            if not in_backward():
                raise
            keep(err)
            return None  # the gradient as it was
        return result

    return run


def _check_hook_result(hook, args, result) -> None:
    given = args[0] if len(args) == 1 else args[1] if len(args) > 1 else None  # tensor hooks; modules' hooks
    if isinstance(given, torch.Tensor):
        given, result = (given,), (result,)
    for was, got in zip(given or (), result or (), strict=False):
        if isinstance(was, torch.Tensor) and isinstance(got, torch.Tensor) and was.device != got.device:
            name = getattr(hook, "__name__", repr(hook))
            message = f"hook '{name}' has changed the type of value (was {_type_name(was)} got {_type_name(got)})"
            devices = (as_cuda(was.device), as_cuda(got.device))
            error = SimulatedDeviceError(message, kind="mixed devices", operation="a backward hook", devices=devices)
            raise _defined_at(error, hook)


def _defined_at(err: SimulatedDeviceError, function) -> SimulatedDeviceError:
    """``err`` at the ``def`` line of ``function``, which has returned (``co_firstlineno`` is its first decorator's)."""
    code = getattr(function, "__code__", None)
    if code is not None:
        lines = range(code.co_firstlineno, code.co_firstlineno + 20)
        defs = (n for n in lines if linecache.getline(code.co_filename, n).lstrip().startswith(("def ", "async def ")))
        where = (code.co_filename, next(defs, code.co_firstlineno), function.__name__, None)
        err._audit_stack = traceback.StackSummary.from_list([where])
    return err


_APPLY = torch.autograd.Function.__dict__["apply"]


@classmethod
def _apply_checked(cls, *args, **kwargs):
    """``Function.apply`` of a custom ``torch.autograd.Function``, whose backward's gradients are checked by a hook
    on its node, as CUDA's engine checks them (``validate_outputs`` in engine.cpp)."""
    result = _APPLY.__get__(None, cls)(*args, **kwargs)
    inputs = [arg.device for arg in args if isinstance(arg, torch.Tensor)]
    outputs = result if isinstance(result, tuple | list) else (result,)
    node = next((out.grad_fn for out in outputs if isinstance(out, torch.Tensor) and out.grad_fn is not None), None)
    if inputs and isinstance(node, torch.autograd.function.BackwardCFunction):
        check = functools.partial(_check_function_gradients, cls, node, inputs)
        node.register_hook(_contained_hook(functools.update_wrapper(check, cls.backward)))
    return result


def _check_function_gradients(cls, node, devices, gradients, _outputs) -> None:
    for index, (was, got) in enumerate(zip(devices, gradients, strict=False)):
        if isinstance(got, torch.Tensor) and got.device != was and got.dim() > 0:  # 0-dim ones CUDA moves
            err = SimulatedDeviceError(
                f"Function {type(node).__name__} returned an invalid gradient at index {index} - "
                f"expected device {as_cuda(was)} but got {as_cuda(got.device)}",
                kind="mixed devices",
                operation=f"{cls.__name__}.backward",
                devices=(as_cuda(was), as_cuda(got.device)),
            )
            raise _defined_at(err, cls.backward)


def _type_name(tensor: torch.Tensor) -> str:
    """ATen's name of ``tensor``'s type, as CUDA's message gives it: ``CUDAFloatType``, ``CPUFloatType``."""
    scalar = legacy_type(tensor).rpartition(".")[2].removesuffix("Tensor")
    return f"{'CPU' if tensor.device.type == 'cpu' else 'CUDA'}{scalar}Type"


_BackwardHookInit = BackwardHook.__init__


def _module_backward_hooks(self, module, user_hooks, user_pre_hooks) -> None:
    """A module's backward hooks (``register_full_backward_hook``, ``..._pre_hook``), each contained."""
    _BackwardHookInit(
        self, module, [_contained_hook(hook) for hook in user_hooks], [_contained_hook(hook) for hook in user_pre_hooks]
    )


@contextmanager
def rnns_in_eval_refuse_backward() -> Iterator[None]:
    """A recurrent module run on the GPU in eval mode with autograd on: cuDNN runs its forward without what the
    backward needs (cudnn/RNN.cpp), so a backward pass through its outputs fails there. Refused as it is reached."""
    handle = torch.nn.modules.module.register_module_forward_hook(_rnn_in_eval)
    try:
        yield
    finally:
        handle.remove()


def _rnn_in_eval(module, _args, output) -> None:
    if not isinstance(module, torch.nn.RNNBase) or module.training or not torch.backends.cudnn.enabled:
        return
    # A PackedSequence is a NamedTuple: flattened to its data and batch sizes.
    outputs = [tensor for tensor in tree_leaves(output) if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
    if not outputs or outputs[0].device.type == "cpu" or not outputs[0].is_floating_point():
        return
    err = SimulatedDeviceError(
        "cudnn RNN backward can only be called in training mode",
        kind="cudnn RNN",
        operation=f"the backward pass of {type(module).__name__} in eval mode",
    )
    err.forward_line = users_line(2, through_libraries=True)  # where the module ran

    def refuse(gradient):
        keep(err)
        return gradient

    for tensor in outputs:
        tensor.register_hook(refuse)
