"""Rule 14 of the placement guide: every device index code can observe is its own process's GPU.

Inside PyTorch every simulated tensor sits on ``simgpu:0`` (its autograd engine serves one index
of a Python device); the simulated GPU puts the index of the process it plays (1 in the audit's
pass as DDP rank 1) wherever code can read one: a tensor's ``.device`` and ``get_device()``, PyTorch's
grouping of tensors by device (optimizers' and ``clip_grad_norm_``'s foreach paths) and
``torch.accelerator``'s current device.
"""

import pytest
import torch
from test_simulated_gpu import BATCH, Probe, assert_rule
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from lightning_kit.gpu_audit import audit, simulated


@pytest.mark.parametrize("index", [0, 1])
def test_every_observable_device_index_is_the_simulated_gpus_own(index):
    with simulated.simulating(index):
        weight = torch.ones(3, device=simulated.device(index), requires_grad=True)
        (weight * 2).sum().backward()
        grouped = _group_tensors_by_device_and_dtype([[weight, weight.grad]])
        observed = {
            "device": weight.device.index,
            "get_device": weight.get_device(),
            "grad": weight.grad.get_device(),
            "grouping": {device.index for device, _ in grouped},
        }
        if torch.accelerator.current_accelerator().type == simulated.DEVICE_TYPE:  # CUDA's, where CUDA is there
            observed["accelerator"] = torch.accelerator.current_device_index()
    assert observed == dict.fromkeys(observed, index) | {"grouping": {index}}


class ClipsInAHook(Probe):
    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)


class AdamWithForeach(Probe):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01, foreach=True)


@pytest.mark.parametrize("model", [ClipsInAHook, AdamWithForeach])
def test_code_that_groups_tensors_by_device_passes_in_every_process(model):
    """clip_grad_norm_ called in a hook and foreach optimizers move tensors to each group's device: rank 1's own."""
    verdict = audit(model(), BATCH)
    assert {(outcome.rank, outcome.error) for outcome in verdict.outcomes if outcome.stage == "fit"} == {
        (0, None),
        (1, None),
    }


class AddsTheNormToACPUTotal(ClipsInAHook):
    def __init__(self, total_on_device: bool) -> None:
        super().__init__()
        if total_on_device:
            self.register_buffer("norms", torch.zeros(1), persistent=False)
        else:
            self.norms = torch.zeros(1)  # a plain attribute: stays on the CPU

    def on_before_optimizer_step(self, optimizer):
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.norms = self.norms + norm  # the norm is on the GPU


def test_a_gradient_norm_added_to_a_cpu_tensor_is_still_caught():
    error = assert_rule(
        AddsTheNormToACPUTotal(False), AddsTheNormToACPUTotal(True), "# the norm is on the GPU", path=__file__
    )
    assert (error.kind, error.rank) == ("mixed devices", 0)
