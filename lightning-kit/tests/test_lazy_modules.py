"""Rule 19 of the placement guide: lazy modules materialise on the device their module was moved to.

``nn.LazyLinear``, ``nn.LazyConv1d``, ``nn.LazyBatchNorm1d``, ...: an uninitialised parameter or
buffer moves with its module and stays uninitialised there, and ``materialize`` (called by
``initialize_parameters`` at the first forward pass) makes its values on that device. On one GPU a
lazy module materialised by the first batch is correct; a dry run with a CPU input after the move
(in ``configure_optimizers``, say) meets weights on the GPU and stops there. Under DDP the model is
wrapped before the first batch and before ``configure_optimizers``, and DDP refuses uninitialised
parameters: only a dry run before the move (in ``setup``, on the CPU) is right on any number of GPUs.
"""

import test_simulated_gpu
import torch
import torch.nn.functional as F
from test_simulated_gpu import BATCH, Probe
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from lightning_kit.gpu_audit import DevicePlacementError, audit, run_audit, simulated


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


def test_lazy_modules_materialised_after_the_move_pass_one_gpu_and_stop_ddps_wrap_by_name():
    for dry_run in (None, "device", "shapes"):
        verdict = run_audit(Lazy(dry_run), BATCH)
        assert [(o.stage, o.rank, o.world_size) for o in verdict.outcomes if o.error is None] == [
            ("fit", 0, 1),
            ("validate", 0, 1),
            ("validate", 0, 2),
            ("validate", 1, 2),
        ], verdict.report()
        (error,) = verdict.errors  # the same bug on both ranks, reported once
        assert (error.kind, error.stage, error.rank) == ("lazy modules", "fit", 0)
        assert "uninitialized: net.1.weight, net.1.bias, net.2.weight, net.2.bias, net.4.weight" in str(error)
        assert "rule 19" in str(error) and "setup()" in str(error)
        assert not verdict.gaps


def test_a_dry_run_after_the_move_takes_the_modules_device():
    error = assert_rule(Lazy("host"), Lazy("setup"), "# a dry run with a CPU input")
    assert (error.kind, error.step) == ("mixed devices", "configure_optimizers")


def test_a_dry_run_before_the_move_passes_on_every_gpu():
    verdict = audit(Lazy("setup"), BATCH)
    assert {(outcome.stage, outcome.rank, outcome.world_size) for outcome in verdict.outcomes} == {
        (stage, rank, world_size) for stage in ("fit", "validate") for rank, world_size in ((0, 1), (0, 2), (1, 2))
    }


def test_audit_leaves_a_lazy_model_uninitialised():
    model = Lazy()
    run_audit(model, BATCH)
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
