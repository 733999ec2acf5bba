"""On a real GPU (tests marked ``gpu``, skipped without one): the audit's verdict is what the GPU does.

Each placement rule's wrong and right version is trained on the device next to the audit's
verdict and FakeTensor's (PyTorch's own device propagation, tests/fake_gpu.py), and the results
are recorded (``record_property``) for the agreement table of ``python -m lightning_kit.gpu_check``.
The same comparison on the simulated GPU (``simgpu``, marked ``slow``) runs anywhere, and checks
the runner itself. tests/test_fake_tensor_agreement.py compares the audit with FakeTensor alone.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import lightning as L
import pytest
import torch
import torch.distributed as dist
from conftest import IMAGE_PROJECT, SEQUENCE_PROJECT
from fake_gpu import on_fake_gpu
from image_project.cli import ProjectCLI as ImageCLI
from sequence_project.cli import ProjectCLI as SequenceCLI
from test_autocast import FillsFloat32Zeros, FillsZerosOfItsDtype
from test_code_checks import NoisyWithCPUGenerator, NoisyWithDeviceGenerator, NumpyAfterCPU, NumpyOfAGPUTensor
from test_collectives import CountsOnTheCPU, CountsOnTheDevice
from test_device_indices import ClipsInAHook
from test_host_arguments import CTC, CTC_PLACEMENTS, DrawsBelow, PackedLSTM, SplitsFeatures
from test_lazy_modules import Lazy
from test_root_gradients import (
    HookMixesDevices,
    HookReturnsHostGradient,
    PenaltyWithHostOnes,
    PenaltyWithOnesLike,
    SaliencyFromHostOnes,
    SaliencyFromOnesLike,
)
from test_simulated_gpu import (
    BATCH,
    AccumulatesInABuffer,
    AccumulatesOnCPU,
    ClampsByANumber,
    ClampsByCPUScalar,
    ComparesOnDevice,
    ConstantAsAttribute,
    ConstantAsBuffer,
    IndexesByHostIndex,
    MetricsIn,
    MovesToCPU,
    PositionsOnInputDevice,
    PositionsWithoutDevice,
    Probe,
    Recurrent,
    SelectsByHostIndex,
    WeighsByDeviceValues,
    WeighsByHostValues,
    WeightedLoss,
)
from torch.utils.data import DataLoader

from lightning_kit.cli import main as train
from lightning_kit.gpu_audit import DevicePlacementError, SimulatedGPUStrategy, audit, simulated
from lightning_kit.gpu_audit.simulated.collectives import process_group

needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# rule: (wrong, right), each a function making the model, and DDP for a rule seen only under DDP.
DDP = "under DDP"
AGREEMENT: dict[str, tuple[Callable[[], L.LightningModule] | str, ...]] = {
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
    "LSTM state": (lambda: Probe(Recurrent(False)), lambda: Probe(Recurrent(True))),
    "dtype mix under autocast": (FillsFloat32Zeros, FillsZerosOfItsDtype),
    "CPU tensor to a collective": (CountsOnTheCPU, CountsOnTheDevice, DDP),
    "index_select by a host index": (SelectsByHostIndex, IndexesByHostIndex),
    "grad_outputs on the host": (PenaltyWithHostOnes, PenaltyWithOnesLike),
    "backward(gradient=) on the host": (SaliencyFromHostOnes, SaliencyFromOnesLike),
    "a hook's gradient on the host": (lambda: HookReturnsHostGradient(False), lambda: HookReturnsHostGradient(True)),
    "a module hook's host tensor": (lambda: HookMixesDevices(False), lambda: HookMixesDevices(True)),
    "tensor built from GPU scalars": (WeighsByHostValues, WeighsByDeviceValues),
    "lazy module's dry run on the host": (lambda: Lazy("host"), lambda: Lazy("setup")),
}
# Right versions that the audit once refused: the audit passes them, and so does a GPU.
RIGHT = {
    **{f"ctc_loss with {placement}": lambda placement=placement: CTC(placement) for placement in CTC_PLACEMENTS},
    "clip_grad_norm_ in a hook": ClipsInAHook,
}


def fit_on_gpu(model: L.LightningModule, **trainer_args) -> None:
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=2, limit_val_batches=2, logger=False, **trainer_args)
    trainer.fit(model, *[DataLoader([BATCH, BATCH], batch_size=None)] * 2)  # training and validation


@contextmanager
def _one_nccl_process() -> Iterator[None]:
    """A real NCCL process group of one process: what a collective meets on a GPU under DDP."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fit_on(device: str, model: L.LightningModule, ddp: bool = False) -> str:
    """``ok``, or the first line of what stopped a short fit on ``device`` (``gpu`` or ``simgpu``)."""
    quiet = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    try:
        if device == "gpu":
            with _one_nccl_process() if ddp else nullcontext():
                fit_on_gpu(model, **quiet)
        else:
            rank, world_size = (1, 2) if ddp else (0, 1)
            trainer = L.Trainer(
                strategy=SimulatedGPUStrategy(rank, world_size), max_steps=2, limit_val_batches=2, logger=False, **quiet
            )
            with process_group(rank, world_size), simulated.simulating(rank):
                trainer.fit(model, *[DataLoader([BATCH, BATCH], batch_size=None)] * 2)
    except (RuntimeError, TypeError) as err:
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
    return "ok"


def audited(model: L.LightningModule) -> str:
    """``ok``, or the bug the audit reports: its kind and line."""
    try:
        audit(model, BATCH)
    except DevicePlacementError as err:
        return f"{err.kind} at line {err.lineno}"
    return "ok"


DEVICES = [pytest.param("gpu", marks=(pytest.mark.gpu, needs_a_gpu)), pytest.param("simgpu", marks=pytest.mark.slow)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", AGREEMENT)
def test_the_device_agrees_with_the_audit(rule, device, record_property):
    """The wrong version fails on the device and in the audit; the right version passes both."""
    wrong, right, *marks = AGREEMENT[rule]
    ddp = DDP in marks
    row = {"rule": rule, "device": device, "audit wrong": audited(wrong()), "audit right": audited(right())}
    row |= {"fake wrong": str(on_fake_gpu(wrong, *marks)), "fake right": str(on_fake_gpu(right, *marks))}
    row |= {"device wrong": fit_on(device, wrong(), ddp), "device right": fit_on(device, right(), ddp)}
    record_property("agreement", json.dumps(row))
    assert row["audit wrong"] != "ok" and row["device wrong"] != "ok", row
    assert row["audit right"] == "ok" == row["device right"], row


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", RIGHT)
def test_the_device_runs_what_the_audit_passes(case, device, record_property):
    """Code the audit once refused by mistake: the audit passes it, and so does the device."""
    row = {"rule": case, "device": device, "audit right": audited(RIGHT[case]())}
    row["fake right"] = str(on_fake_gpu(RIGHT[case]))
    row["device right"] = fit_on(device, RIGHT[case]())
    record_property("agreement", json.dumps(row))
    assert row["audit right"] == "ok" == row["device right"], row


# Each task's project: its command line and its offline configuration.
PROJECTS = {"image": (IMAGE_PROJECT, ImageCLI), "sequence": (SEQUENCE_PROJECT, SequenceCLI)}


@pytest.mark.gpu
@needs_a_gpu
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("task", PROJECTS)
def test_the_shipped_model_trains_on_a_gpu(in_tmp_path, fast_args, synthetic_config, task, precision, capsys):
    """Each task's project trains on a GPU: images, and token sequences."""
    project, cli_class = PROJECTS[task]
    config = str(project / "configs" / "synthetic.yaml")
    args = [config if arg == synthetic_config else arg for arg in fast_args]
    train(cli_class, [*args, "--accelerator", "gpu", "--max_epochs", "1", "--precision", precision])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out
