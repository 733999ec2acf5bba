"""Rule 13 of the placement guide: lengths and sizes that CUDA reads on the host, each shown wrong and right.

Some CUDA kernels read lengths, split points or bounds on the host: those arguments must be CPU
tensors, and a GPU tensor stops at its line (``HOST_ARGUMENTS`` in
``gpu_audit/simulated/rules.py`` lists them from PyTorch's sources). ``ctc_loss`` copies its
lengths to the host, and its targets to the GPU, itself: every placement of them passes
(``CUDA_PATHS``, the path CUDA takes where ATen takes another for tensor subclasses).
"""

import pytest
import torch
import torch.nn.functional as F
from test_simulated_gpu import BATCH, Probe, assert_rule
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightning_kit.gpu_audit import audit, simulated
from lightning_kit.gpu_audit.simulated.rules import CUDA_PATHS, HOST_ARGUMENTS


class PackedLSTM(Probe):
    """An LSTM over (B, 8) features seen as sequences of 2 steps of 4, packed by their lengths."""

    def __init__(self, lengths_on_host: bool) -> None:
        super().__init__(nn.Linear(6, 3))
        self.lengths_on_host = lengths_on_host
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, features):
        steps = features.view(features.shape[0], 2, 4)  # (batch, time, feature)
        lengths = 1 + (features[:, 0] > 0).long()  # each sequence's length, computed on the GPU
        if self.lengths_on_host:
            lengths = lengths.cpu()
        packed = pack_padded_sequence(steps, lengths, batch_first=True, enforce_sorted=False)  # lengths
        output, _ = self.lstm(packed)
        padded, _ = pad_packed_sequence(output, batch_first=True, total_length=2)
        return self.net(padded.sum(dim=1))


def test_packed_sequences_take_their_lengths_on_the_cpu():
    """pack_padded_sequence reads the lengths on the host: GPU lengths stop there, CPU lengths train and validate."""
    error = assert_rule(PackedLSTM(False), PackedLSTM(True), "enforce_sorted=False)  # lengths", path=__file__)
    assert error.kind == "host tensor" and "'lengths' argument should be a 1D CPU int64 tensor" in str(error)


class SplitsFeatures(Probe):
    def __init__(self, points_on_host: bool) -> None:
        super().__init__()
        self.points_on_host = points_on_host

    def forward(self, features):
        points = torch.tensor([3, 5]) if self.points_on_host else torch.tensor([3, 5], device=features.device)
        parts = torch.tensor_split(features, points, dim=1)  # split points
        return self.net(torch.cat([parts[2], parts[1], parts[0]], dim=1))


def test_tensor_split_takes_its_split_points_on_the_cpu():
    """tensor_split reads its split points on the host, in training (autograd) and validation (inference mode)."""
    error = assert_rule(SplitsFeatures(False), SplitsFeatures(True), "# split points", path=__file__)
    assert "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on cuda:0" in str(error)


class DrawsBelow(Probe):
    def __init__(self, bound_on_host: bool) -> None:
        super().__init__()
        self.bound_on_host = bound_on_host

    def forward(self, features):
        bound = torch.tensor(3) if self.bound_on_host else features.new_tensor(3, dtype=torch.long)
        noise = torch.randint_like(features, bound)  # a tensor bound
        return self.net(features + 0.01 * noise)


def test_randint_like_takes_its_tensor_bound_on_the_cpu():
    error = assert_rule(DrawsBelow(False), DrawsBelow(True), "# a tensor bound", path=__file__)
    assert "high must be a scalar tensor and on CPU" in str(error)


class CTC(Probe):
    """CTC over the batch seen as one sequence of B steps of 3 classes (class 0 is the blank)."""

    def __init__(self, placement: str) -> None:
        super().__init__()
        self.placement = placement

    def training_step(self, batch, batch_idx):
        features, labels = batch
        log_probs = self(features).log_softmax(dim=1).unsqueeze(1)  # (time, batch=1, classes)
        targets = labels.clamp(min=1)[:3].unsqueeze(0)  # (batch=1, target length 3), on the GPU
        input_lengths, target_lengths = torch.tensor([features.shape[0]]), torch.tensor([3])
        if self.placement == "lengths on the GPU":
            input_lengths, target_lengths = input_lengths.to(self.device), target_lengths.to(self.device)
        elif self.placement == "targets on the CPU":
            targets = targets.cpu()
        elif self.placement == "lengths as lists":
            input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.training_step(batch, batch_idx))


CTC_PLACEMENTS = ["lengths on the CPU", "lengths on the GPU", "targets on the CPU", "lengths as lists"]


@pytest.mark.parametrize("placement", CTC_PLACEMENTS)
def test_ctc_loss_takes_its_lengths_and_targets_on_either_device(placement):
    """CUDA's ctc_loss copies tensor lengths to the host and targets to the GPU: every placement passes."""
    verdict = audit(CTC(placement), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("fit", 1)}


def test_ctc_loss_on_the_simulated_gpu_computes_what_the_cpu_computes():
    """CUDA's path for tensor lengths gives the loss and gradient of ctc_loss on plain CPU tensors."""
    log_probs = torch.randn(6, 2, 4).log_softmax(dim=2).requires_grad_()
    targets, input_lengths, target_lengths = torch.randint(1, 4, (2, 3)), torch.tensor([6, 5]), torch.tensor([3, 2])
    expected = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
    (expected_grad,) = torch.autograd.grad(expected, log_probs)
    with simulated.simulating():
        on_device = log_probs.detach().to(simulated.device()).requires_grad_()
        loss = F.ctc_loss(on_device, targets.to(on_device.device), input_lengths, target_lengths)
        (grad,) = torch.autograd.grad(loss, on_device)
        assert loss.device == on_device.device
        loss, grad = simulated.to_cpu((loss, grad))
    torch.testing.assert_close((loss, grad), (expected, expected_grad))


def _packed(x):
    """The data of ``x``, (batch 2, time 2, features 4), packed with lengths [2, 1]: 3 steps of 4."""
    return x.reshape(4, 4)[:3]


def _recurrent(kind: str, x, batch_sizes):
    """``kind`` (lstm, gru, rnn_tanh, rnn_relu) over the packed data of ``x``: one layer of 5, no biases."""
    gates = {"lstm": 4, "gru": 3}.get(kind, 1)
    state = x.new_zeros(1, 2, 5)
    weights = [x.new_ones(5 * gates, 4), x.new_ones(5 * gates, 5)]
    hx = [state, state] if kind == "lstm" else state
    return getattr(torch.ops.aten, kind).data(_packed(x), batch_sizes, hx, weights, False, 1, 0.0, False, False)


# One call of each operation of HOST_ARGUMENTS, given its host argument on ``device``.
CALLS = {
    "_pack_padded_sequence": lambda x, device: torch.ops.aten._pack_padded_sequence(
        x, torch.tensor([2, 1], device=device), True
    ),
    "_pad_packed_sequence": lambda x, device: torch.ops.aten._pad_packed_sequence(
        _packed(x), torch.tensor([2, 1], device=device), True, 0.0, 2
    ),
    "_pack_padded_sequence_backward": lambda x, device: torch.ops.aten._pack_padded_sequence_backward(
        _packed(x), [2, 2, 4], torch.tensor([2, 1], device=device), True
    ),
    **{
        f"{kind}.data": lambda x, device, kind=kind: _recurrent(kind, x, torch.tensor([2, 1], device=device))
        for kind in ("lstm", "gru", "rnn_tanh", "rnn_relu")
    },
    "tensor_split.tensor_indices_or_sections": lambda x, device: torch.tensor_split(
        x, torch.tensor([1], device=device)
    ),
    "randint_like.Tensor": lambda x, device: torch.randint_like(x, torch.tensor(3, device=device)),
}


def test_every_host_argument_has_a_call_here():
    assert set(CALLS) == set(HOST_ARGUMENTS) and set(CUDA_PATHS) == {"ctc_loss.Tensor"}


@pytest.mark.parametrize("mode", [torch.enable_grad, torch.inference_mode])
@pytest.mark.parametrize("operation", sorted(HOST_ARGUMENTS))
def test_each_host_argument_is_refused_on_the_gpu_and_taken_on_the_cpu(operation, mode):
    """With autograd (where PyTorch decomposes composite operations) and in inference mode (where it does not)."""
    with simulated.simulating(1), mode():
        x = torch.randn(2, 2, 4, device=simulated.device(1))
        CALLS[operation](x, "cpu")
        with pytest.raises(simulated.SimulatedDeviceError) as caught:
            CALLS[operation](x, x.device)
    error = caught.value
    (argument,) = HOST_ARGUMENTS[operation]
    assert (error.kind, error.argument, error.devices) == ("host tensor", argument, ("cpu", "cuda:1"))
