"""Rule 19 of the placement guide: lazy modules materialise on the device their module was moved to.

``nn.LazyLinear``, ``nn.LazyConv1d``, ``nn.LazyBatchNorm1d``, ...: an uninitialised parameter or
buffer moves with its module and stays uninitialised there, and ``materialize`` (called by
``initialize_parameters`` at the first forward pass) makes its values on that device. On a GPU a
lazy module materialised by the first batch is correct; a dry run with a CPU input after the move
(in ``configure_optimizers``, say) meets weights on the GPU and stops there. A dry run before the
move (in ``setup``, on the CPU) is correct too.
"""

import test_simulated_gpu
import torch
import torch.nn.functional as F
from test_simulated_gpu import BATCH, Probe
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from lightning_kit.placement import DevicePlacementError, audit, simulated


def assert_rule(wrong, right, marker: str) -> DevicePlacementError:
    return test_simulated_gpu.assert_rule(wrong, right, marker, path=__file__)


class Lazy(Probe):
    """A network whose layers learn their input sizes from the first batch: a convolution, a batch norm, a head."""

    def __init__(self, dry_run: str | None = None) -> None:
        super().__init__(
            nn.Sequential(
                nn.Unflatten(1, (1, 8)), nn.LazyConv1d(4, 3), nn.LazyBatchNorm1d(), nn.Flatten(), nn.LazyLinear(3)
            )
        )
        self.dry_run = dry_run

    def setup(self, stage):
        if self.dry_run == "setup":
            self(torch.zeros(2, 8))  # on the CPU, before Lightning moves the model: right too

    def configure_optimizers(self):
        if self.dry_run == "host":
            self.net(torch.zeros(2, 8))  # a dry run with a CPU input
        elif self.dry_run == "device":
            self.net(torch.zeros(2, 8, device=self.device))
        elif self.dry_run == "shapes":
            self.net[4].initialize_parameters(torch.zeros(2, 24))  # reads the input's shape only
        return torch.optim.Adam(self.parameters(), lr=0.01)


def test_lazy_modules_materialised_by_the_first_batch_pass():
    verdict = audit(Lazy(), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} == {
        (stage, rank) for stage in ("fit", "validate") for rank in (0, 1)
    }


def test_a_dry_run_after_the_move_takes_the_modules_device():
    error = assert_rule(Lazy("host"), Lazy("device"), "# a dry run with a CPU input")
    assert (error.kind, error.step) == ("mixed devices", "configure_optimizers")


def test_a_dry_run_before_the_move_and_initialize_parameters_pass():
    audit(Lazy("setup"), BATCH)
    audit(Lazy("shapes"), BATCH)


def test_audit_leaves_a_lazy_model_uninitialised():
    model = Lazy()
    audit(model, BATCH)
    assert isinstance(model.net[1].weight, UninitializedParameter)
    assert isinstance(model.net[2].running_mean, UninitializedBuffer)


def test_an_uninitialised_parameter_moves_in_place_and_materialises_on_the_simulated_gpu():
    """What ``module.to`` does to each: the same object, uninitialised, on the device; materialised there; the
    optimizer made before the first batch holds the materialised parameter; back to the CPU unmarked."""
    with simulated.simulating(1):
        layer = nn.LazyLinear(3)
        weight = layer.weight
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer.to(simulated.device(1))
        assert layer.weight is weight and isinstance(weight, UninitializedParameter)
        assert weight.device == simulated.cuda_device(1)  # as the user's code is told it
        out = layer(torch.ones(2, 5, device=simulated.device(1)))
        assert layer.weight is weight and not isinstance(weight, UninitializedParameter)
        assert isinstance(weight, nn.Parameter) and weight.device == simulated.cuda_device(1) and weight.shape == (3, 5)
        F.mse_loss(out, torch.zeros_like(out)).backward()
        optimizer.step()
        assert weight.grad.device == simulated.cuda_device(1)
        moved_back = nn.LazyLinear(3).to(simulated.device(1)).cpu()
        assert isinstance(moved_back.weight, UninitializedParameter) and moved_back.weight.device.type == "cpu"
        assert moved_back(torch.ones(2, 4)).device.type == "cpu"
