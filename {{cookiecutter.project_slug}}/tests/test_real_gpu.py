"""On a real GPU (tests marked ``gpu``, skipped without one): the audit's verdict is what the GPU does."""

import lightning as L
import pytest
import torch
from test_code_checks import NoisyWithCPUGenerator, NoisyWithDeviceGenerator, NumpyAfterCPU, NumpyOfAGPUTensor
from test_device_indices import ClipsInAHook
from test_host_arguments import CTC, CTC_PLACEMENTS, DrawsBelow, PackedLSTM, SplitsFeatures
from test_simulated_gpu import (
    BATCH,
    AccumulatesInABuffer,
    AccumulatesOnCPU,
    ClampsByANumber,
    ClampsByCPUScalar,
    ComparesOnDevice,
    ConstantAsAttribute,
    ConstantAsBuffer,
    MetricsIn,
    MovesToCPU,
    PositionsOnInputDevice,
    PositionsWithoutDevice,
    Probe,
    WeightedLoss,
)
from torch.utils.data import DataLoader

from {{ cookiecutter.project_slug }}.cli import main as train
from {{ cookiecutter.project_slug }}.placement import DevicePlacementError, audit

needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (wrong, right, what the wrong version needs to fail on a real machine)
AGREEMENT = {
    "tensor created in forward": (lambda: Probe(PositionsWithoutDevice()), lambda: Probe(PositionsOnInputDevice())),
    "constant as attribute": (lambda: Probe(ConstantAsAttribute()), lambda: Probe(ConstantAsBuffer())),
    "loss weight": (lambda: WeightedLoss(False), lambda: WeightedLoss(True)),
    "metric in a dict": (lambda: MetricsIn("dict"), lambda: MetricsIn("ModuleDict")),
    ".cpu() in a step": (MovesToCPU, ComparesOnDevice),
    ".numpy() of a GPU tensor": (NumpyOfAGPUTensor, NumpyAfterCPU),
    "clamp by a CPU scalar": (ClampsByCPUScalar, ClampsByANumber),
    "epoch-end state": (AccumulatesOnCPU, AccumulatesInABuffer),
    "CPU generator": (NoisyWithCPUGenerator, NoisyWithDeviceGenerator),
    "packed sequence's lengths on the GPU": (lambda: PackedLSTM(False), lambda: PackedLSTM(True)),
    "tensor_split's points on the GPU": (lambda: SplitsFeatures(False), lambda: SplitsFeatures(True)),
    "randint_like's bound on the GPU": (lambda: DrawsBelow(False), lambda: DrawsBelow(True)),
}
# Right versions that the audit once refused: the audit passes them, and so does a GPU.
RIGHT = {
    **{f"ctc_loss with {placement}": lambda placement=placement: CTC(placement) for placement in CTC_PLACEMENTS},
    "clip_grad_norm_ in a hook": ClipsInAHook,
}


def fit_on_gpu(model: L.LightningModule, **trainer_args) -> None:
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=2, limit_val_batches=2, logger=False, **trainer_args)
    trainer.fit(model, DataLoader([BATCH, BATCH], batch_size=None))


@pytest.mark.gpu
@needs_a_gpu
@pytest.mark.parametrize("rule", AGREEMENT)
def test_a_real_gpu_agrees_with_the_audit(rule):
    wrong, right = AGREEMENT[rule]
    with pytest.raises(DevicePlacementError):
        audit(wrong(), BATCH)
    with pytest.raises((RuntimeError, TypeError)):
        fit_on_gpu(wrong(), enable_checkpointing=False)
    audit(right(), BATCH)
    fit_on_gpu(right(), enable_checkpointing=False)


@pytest.mark.gpu
@needs_a_gpu
@pytest.mark.parametrize("case", RIGHT)
def test_a_real_gpu_runs_what_the_audit_passes(case):
    audit(RIGHT[case](), BATCH)
    fit_on_gpu(RIGHT[case](), enable_checkpointing=False)


@pytest.mark.gpu
@needs_a_gpu
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_shipped_model_trains_on_a_gpu(in_tmp_path, fast_args, precision, capsys):
    train([*fast_args, "--accelerator", "gpu", "--max_epochs", "1", "--precision", precision])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out
