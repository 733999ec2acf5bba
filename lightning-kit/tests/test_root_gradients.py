"""Rule 17 of the placement guide: a gradient handed to the autograd engine is on its tensor's device.

The engine checks the gradients a backward pass starts from (``grad_outputs`` of
``torch.autograd.grad``, ``grad_tensors`` of ``torch.autograd.backward``, ``gradient`` of
``tensor.backward``): on CUDA a host one stops with "invalid gradient at index 0 - expected device
cuda:0 but got cpu"; a 0-dim one is moved. PyTorch skips that check for tensor subclasses, so the
simulated GPU makes it before the engine runs. A backward hook that returns a gradient on another
device than the one it was given is refused too ("hook 'h' has changed the type of value").
Each wrong version stops at its line; each right version passes.
"""

import lightning as L
import pytest
import test_simulated_gpu
import torch
import torch.nn.functional as F
from test_simulated_gpu import BATCH, Probe

from lightning_kit.gpu_audit import DevicePlacementError, audit, run_audit


def line_of(marker: str) -> int:
    return test_simulated_gpu.line_of(marker, __file__)


def assert_rule(wrong: L.LightningModule, right: L.LightningModule, marker: str) -> DevicePlacementError:
    """The wrong version stops at this file's line holding ``marker``; the right version passes every stage."""
    return test_simulated_gpu.assert_rule(wrong, right, marker, path=__file__)


class PenaltyWithHostOnes(Probe):
    """A gradient penalty: the gradient of each sample's loss, started from ones."""

    def ones(self, losses):
        return torch.ones(losses.shape[0])

    def training_step(self, batch, batch_idx):
        features, labels = batch
        losses = F.cross_entropy(self(features), labels, reduction="none")
        weight = self.net.weight
        (grad,) = torch.autograd.grad(losses, [weight], grad_outputs=self.ones(losses), create_graph=True)  # ones
        return losses.mean() + 0.01 * grad.pow(2).sum()


class PenaltyWithOnesLike(PenaltyWithHostOnes):
    def ones(self, losses):
        return torch.ones_like(losses)


class PenaltyFromAHostScalar(PenaltyWithHostOnes):
    """A 0-dim host gradient: the engine moves it to the output's device, on CUDA as here."""

    def training_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        (grad,) = torch.autograd.grad(loss, [self.net.weight], grad_outputs=torch.tensor(1.0), create_graph=True)
        return loss + 0.01 * grad.pow(2).sum()


def test_grad_outputs_are_on_the_outputs_device():
    error = assert_rule(PenaltyWithHostOnes(), PenaltyWithOnesLike(), "# ones")
    assert error.kind == "root gradient" and error.step == "training_step"
    assert "invalid gradient at index 0 - expected device cuda:0 but got cpu" in str(error)
    assert "`grad_outputs`" in str(error) and "rule 17" in str(error)


def test_a_0_dim_host_gradient_is_moved_as_cuda_moves_it():
    audit(PenaltyFromAHostScalar(), BATCH)


class SaliencyFromHostOnes(Probe):
    """The gradient of each sample's top score with respect to its features, from ``backward(gradient=...)``."""

    def ones(self, scores):
        return torch.ones(scores.shape[0])

    def training_step(self, batch, batch_idx):
        features, labels = batch
        inputs = features.detach().requires_grad_()
        scores = self(inputs).max(dim=1).values
        scores.backward(gradient=self.ones(scores), inputs=[inputs])  # from the host
        saliency = inputs.grad.abs().mean()
        return F.cross_entropy(self(features), labels) + 0 * saliency


class SaliencyFromOnesLike(SaliencyFromHostOnes):
    def ones(self, scores):
        return scores.new_ones(scores.shape[0])


def test_a_backward_passs_gradient_is_on_the_tensors_device():
    error = assert_rule(SaliencyFromHostOnes(), SaliencyFromOnesLike(), "# from the host")
    assert (error.kind, error.operation) == ("root gradient", "Tensor.backward") and "`gradient`" in str(error)


class ManualWithHostGradients(Probe):
    """Manual optimization, the backward pass started with ``torch.autograd.backward(..., grad_tensors=...)``."""

    def __init__(self, right: bool) -> None:
        super().__init__()
        self.automatic_optimization, self.right = False, right

    def training_step(self, batch, batch_idx):
        features, labels = batch
        losses = F.cross_entropy(self(features), labels, reduction="none")
        optimizer = self.optimizers()
        optimizer.zero_grad()
        weights = torch.ones_like(losses) if self.right else torch.ones(losses.shape[0])
        torch.autograd.backward([losses], grad_tensors=[weights])  # weights per sample
        optimizer.step()


def test_grad_tensors_are_on_the_tensors_device():
    error = assert_rule(ManualWithHostGradients(False), ManualWithHostGradients(True), "# weights per sample")
    assert (error.kind, error.operation) == ("root gradient", "torch.autograd.backward")


class HookReturnsHostGradient(Probe):
    """A tensor hook that replaces the logits' gradient: on the host, or on the gradient's device."""

    def __init__(self, right: bool) -> None:
        super().__init__()
        self.right = right

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        logits.register_hook(self.clipped)
        return F.cross_entropy(logits, labels)

    def clipped(self, grad):
        return grad.clamp(-1, 1) if self.right else grad.clamp(-1, 1).cpu()  # the hook's gradient


def test_a_hooks_gradient_stays_on_the_gradients_device():
    error = assert_rule(HookReturnsHostGradient(False), HookReturnsHostGradient(True), "def clipped")
    assert error.kind == "mixed devices" and "has changed the type of value (was CUDAFloatType got CPUFloatType)" in (
        str(error)
    )
    assert error.hook.endswith("training_step (backward)")


class HookMixesDevices(Probe):
    """A module's backward hook that scales the input's gradient by a host tensor."""

    def __init__(self, right: bool) -> None:
        super().__init__()
        self.right = right
        self.net.register_full_backward_pre_hook(self.scaled)

    def scaled(self, module, grad_output):
        (grad,) = grad_output
        scale = torch.full_like(grad, 0.5) if self.right else torch.full(grad.shape, 0.5)
        return (grad * scale,)  # scaled in the hook


def test_a_module_hooks_tensors_are_on_the_gradients_device():
    error = assert_rule(HookMixesDevices(False), HookMixesDevices(True), "# scaled in the hook")
    assert error.kind == "mixed devices" and error.stage == "fit"


class HookRaises(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        logits.register_hook(self.refuse)
        return F.cross_entropy(logits, labels)

    def refuse(self, grad):
        raise ValueError("this hook refuses")  # raised inside the backward pass


def test_an_exception_in_a_backward_hook_is_not_audited_at_its_line():
    """Not a placement bug (a GPU raises it too): the stage is not audited, at the hook's line."""
    verdict = run_audit(HookRaises(), BATCH)
    [gap, *_] = verdict.gaps
    assert f"test_root_gradients.py:{line_of('# raised inside the backward pass')}" in gap.gap
    assert "ValueError: this hook refuses" in gap.gap


@pytest.mark.parametrize("isolate", [False, True])
def test_the_verdict_is_the_same_in_a_forked_audit(isolate):
    """``audit(..., isolate=True)`` runs the stages in a forked copy of the process: the same bug, line and hook."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(PenaltyWithHostOnes(), BATCH, isolate=isolate)
    error = caught.value
    assert (error.kind, error.lineno, error.hook) == (
        "root gradient",
        line_of("# ones"),
        "PenaltyWithHostOnes.training_step",
    )
