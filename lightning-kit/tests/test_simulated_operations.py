"""How the simulated GPU runs one operation, and what it spends on it.

Nearly every operation is given the device's tensors alone: it is computed on the CPU tensors inside and its
results are wrapped, with no device check to make (``tensor._direct``). One given a tensor of another device, a
device by name, or an argument CUDA reads on the host takes the checks first (``__torch_dispatch__``). Either way
the results are the CPU's, with the CPU's shapes and strides, on the device. In a backward pass the checks on
code (a TorchFunctionMode) are on for the user's hooks, and never see the simulated GPU's own work.
"""

import pytest
import torch
from torch import nn

from lightning_kit.gpu_audit import simulated
from lightning_kit.gpu_audit.simulated import NotSimulatedError, SimulatedTensor, code_checks

torch.manual_seed(0)
A, B = torch.randn(4, 6), torch.randn(6, 5)

# Each: the operation, on tensors of either device. Views, several results, a list of tensors, keyword arguments,
# in-place operations, and a CPU scalar beside the device's tensors (the checked path).
OPERATIONS = {
    "element-wise": lambda a, b: a * 2 + a.exp(),
    "matmul": lambda a, b: a @ b,
    "transposed view": lambda a, b: a.t(),
    "sliced view": lambda a, b: a[1:, ::2],
    "several results": lambda a, b: a.max(dim=1),
    "a list of tensors": lambda a, b: torch.cat([a, a], dim=0),
    "keyword arguments": lambda a, b: a.sum(dim=0, dtype=torch.float64),
    "in place": lambda a, b: a.clone().add_(1).mul_(a),
    "out=": lambda a, b: torch.mul(a, 2, out=torch.empty_like(a)),
    "like, on the input's device": lambda a, b: torch.zeros_like(a) + torch.full_like(a, 2.0, dtype=torch.float64),
    "like, on a device named": lambda a, b: torch.ones_like(a, device=a.device) * a,
    "with a cpu scalar": lambda a, b: a * torch.tensor(3.0),
}


@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference"])
def test_an_operation_on_the_device_computes_what_the_cpu_computes(operation, inference):
    simulated.enable()
    expected = operation(A, B)
    with simulated.simulating(), torch.inference_mode(inference), simulated.count_operations() as counted:
        got = operation(SimulatedTensor(A), SimulatedTensor(B))
    assert counted.count > 0
    for want, have in zip(*(out if isinstance(out, tuple) else (out,) for out in (expected, got)), strict=True):
        assert isinstance(have, SimulatedTensor) and have.device == simulated.device(0)
        assert (have.shape, have.stride(), have.dtype) == (want.shape, want.stride(), want.dtype)
        assert torch.equal(have.elem, want)


@pytest.mark.parametrize(
    "operation, dtype, name",
    [
        (lambda a: a @ a, torch.bool, "aten.mm"),
        (lambda a: torch.linalg.cholesky(a), torch.float16, "aten.linalg_cholesky_ex"),
        (lambda a: a.mm(a) * torch.tensor(2), torch.bool, "aten.mm"),
    ],
    ids=["matmul of booleans", "cholesky in half precision", "then a cpu scalar"],
)
def test_an_operation_the_cpu_has_no_kernel_for_is_not_simulated_naming_it(operation, dtype, name):
    simulated.enable()
    with simulated.simulating(), pytest.raises(NotSimulatedError, match=f"{name}.*not implemented"):
        operation(SimulatedTensor(torch.eye(3).to(dtype)))


def _calls_of_the_checks_on_code(monkeypatch) -> list:
    calls = []
    checked = code_checks._CodeChecks.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return checked(self, func, types, args, kwargs)

    monkeypatch.setattr(code_checks._CodeChecks, "__torch_function__", counted)
    return calls


def test_a_backward_pass_runs_the_checks_on_code_for_the_users_hooks_alone(monkeypatch):
    simulated.enable()
    net = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3)).to(simulated.device(0))
    features = SimulatedTensor(A)
    with simulated.simulating():
        loss = net(features).square().mean()
        calls = _calls_of_the_checks_on_code(monkeypatch)
        with simulated.count_operations() as counted:
            loss.backward()
    # The pass itself (Tensor.backward) is checked; the dozens of operations it ran on the device are not.
    assert counted.count > 20 and calls == [torch.Tensor.backward]

    def hook(grad):
        return grad * 2  # the user's code, in the backward pass

    with simulated.simulating():
        output = net(features)
        output.register_hook(hook)
        loss = output.square().mean()
        calls.clear()
        loss.backward()
    assert torch.Tensor.mul in calls


@pytest.mark.parametrize("index", [0, 1])
def test_a_tensor_moved_to_its_own_device_is_itself_as_on_a_gpu(index):
    # As the second process, PyTorch sees the current device as index 0: a call that names it by its index is mapped.
    simulated.enable()
    with simulated.simulating(index):
        here = simulated.device(index)
        tensor = torch.ones(3).to(here)
        assert tensor.to(here) is tensor and tensor.to(device=str(here)) is tensor and tensor.to("simgpu") is tensor
        assert torch.as_tensor(tensor, device=here) is tensor
        told = simulated.cuda_device(index)  # what this code, the user's, is told the device is
        assert torch.zeros(2, device=here).device == told and torch.zeros(2, device=here).tolist() == [0.0, 0.0]
        converted = tensor.to(here, torch.float64)  # another dtype: a copy, on the same device
        assert converted is not tensor and converted.dtype == torch.float64 and converted.device == told
        assert tensor.to(here, copy=True) is not tensor
