"""The placement rules about what the code says, not where its tensors are: each shown wrong and right.

While simulating, the simulated GPU (``gpu_audit/simulated/code_checks.py``) stops at
``.numpy()`` of a GPU tensor, at a CPU generator drawing GPU numbers, at a device written
into the code and, in the second process of a DDP run, at code that picks another
process's GPU: where a GPU run would fail because of what the code says.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_simulated_gpu import BATCH, Probe, assert_rule, line_of

from lightning_kit.gpu_audit import DevicePlacementError, audit

# Rule 6, continued: no .numpy() of a GPU tensor.


class NumpyOfAGPUTensor(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.share = float(np.mean(logits.argmax(dim=1).numpy() == 0))  # .numpy() of a GPU tensor
        return F.cross_entropy(logits, labels)


class NumpyAfterCPU(NumpyOfAGPUTensor):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.share = float(np.mean(logits.argmax(dim=1).cpu().numpy() == 0))
        return F.cross_entropy(logits, labels)


def test_numpy_needs_a_cpu_tensor():
    error = assert_rule(NumpyOfAGPUTensor(), NumpyAfterCPU(), "# .numpy() of a GPU tensor", __file__)
    assert error.kind == "numpy" and "TypeError: can't convert cuda:0" in str(error)


class NumpyAfterToCPUInValidation(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        for on_cpu in (logits.to("cpu", torch.float64), logits.to(labels.cpu()), logits.to(torch.device("cpu"))):
            self.share = float(np.mean(on_cpu.numpy() == 0))
        self.log("val/loss", F.cross_entropy(logits, labels))


def test_every_way_of_moving_to_the_cpu_works_under_inference_mode_too():
    """validate runs in inference mode, where .to(device, dtype) and .to(tensor) reach the simulated GPU whole."""
    audit(NumpyAfterToCPUInValidation(), BATCH)


# Rule 10: a random generator belongs to the device it draws for.


class NoisyWithCPUGenerator(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        noise = torch.randn(features.shape, device=features.device, generator=self.generator)  # a CPU generator
        return F.cross_entropy(self(features + noise), labels)


class NoisyWithDeviceGenerator(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        generator = torch.Generator(device=features.device).manual_seed(batch_idx)
        noise = torch.randn(features.shape, device=features.device, generator=generator)
        return F.cross_entropy(self(features + noise), labels)


def test_generators_are_made_on_the_device_they_draw_for():
    error = assert_rule(NoisyWithCPUGenerator(), NoisyWithDeviceGenerator(), "# a CPU generator", __file__)
    assert error.kind == "generator"


# Rule 11: no device written into the code. The simulated GPU is CUDA to the code: "cuda" and .cuda() are the
# process's own GPU, which runs on a GPU (and is noted, since --accelerator cpu breaks on a machine with one);
# "cuda:0" is another process's GPU in every DDP process but the first.


class WritesCuda0(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        offset = torch.zeros(3, device="cuda:0")  # a device written into the code
        return F.cross_entropy(self(features) + offset, labels)


class TakesTheModuleDevice(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features) + torch.zeros(3, device=self.device), labels)


class CallsCuda(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features.cuda()), labels)  # .cuda()


class PicksDeviceZero(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        device = torch.device(features.device.type, 0)
        return F.cross_entropy(self(features + torch.zeros(8, device=device)), labels)  # assumes GPU 0


def test_gpu_0_written_into_the_code_is_another_processs_gpu_under_ddp():
    """Right in the first process, where cuda:0 is its GPU; the first operation meeting rank 1's tensors fails."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(WritesCuda0(), BATCH)
    error = caught.value
    assert (error.lineno, error.rank, error.kind) == (
        line_of("# a device written into the code", __file__),
        1,
        "another GPU",
    )
    assert "cuda:1 and cuda:0" in str(error)
    audit(TakesTheModuleDevice(), BATCH)


def test_the_gpu_named_by_the_code_runs_on_a_gpu_and_is_noted():
    """.cuda() is the process's own GPU in every process: no failure, but a note naming the line and rule 11."""
    verdict = audit(CallsCuda(), BATCH)
    assert not verdict.errors and not verdict.gaps
    (note,) = [note for note in verdict.notes if "names the GPU itself" in note]
    assert f"test_code_checks.py:{line_of('# .cuda()', __file__)} names the GPU itself (.cuda())" in note
    assert "--accelerator cpu" in note and "rule 11" in note
    assert not [note for note in audit(TakesTheModuleDevice(), BATCH).notes if "names the GPU" in note]


def test_ddp_rank_1_catches_code_that_assumes_gpu_0():
    """Right on the first GPU, wrong in every other DDP process: found by the audit's pass as DDP rank 1."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(PicksDeviceZero(), BATCH)
    error = caught.value
    assert (error.lineno, error.rank, error.kind) == (line_of("# assumes GPU 0", __file__), 1, "another GPU")
