"""The placement rules of docs/device-placement.md, each shown wrong and right on the simulated GPU.

The audit trains a model with Lightning's own Trainer on a simulated CUDA GPU that
computes real values on the CPU and applies CUDA's rules for devices: fit (every hook,
backward, optimizer), validate, test and predict, then all again as rank 1 of a DDP
run. Each rule below has a test in which the wrong version stops at the line a GPU
would stop at, and the right version passes. Tests marked ``gpu`` run the same
versions on a real GPU and check that it agrees with the audit.
"""

import copy
import inspect
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, StochasticWeightAveraging
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

from {{ cookiecutter.project_slug }} import placement, simulated_gpu
from {{ cookiecutter.project_slug }}.cli import build_all
from {{ cookiecutter.project_slug }}.cli import main as train
from {{ cookiecutter.project_slug }}.placement import AuditIncompleteError, DevicePlacementError, audit

PROJECT = Path(__file__).resolve().parents[1]
BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))
needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Probe(L.LightningModule):
    """The smallest complete LightningModule: ``net`` maps (B, 8) features to (B, 3) logits."""

    def __init__(self, net: nn.Module | None = None) -> None:
        super().__init__()
        self.net = net if net is not None else nn.Linear(8, 3)

    def forward(self, features):
        return self.net(features)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features), labels)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.log("val/loss", F.cross_entropy(self(features), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker``."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def assert_rule(wrong: L.LightningModule, right: L.LightningModule, marker: str, **audit_args) -> DevicePlacementError:
    """The wrong version stops at the line holding ``marker``; the right version passes every stage."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(wrong, BATCH, **audit_args)
    error = caught.value
    assert (error.filename, error.lineno) == (__file__, line_of(marker)), str(error)
    verdict = audit(right, BATCH, **audit_args)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("fit", 1)}
    return error


# Rule 1: Lightning places the model (parameters and buffers) and the batch.


def test_shipped_model_and_data_pass_the_audit(in_tmp_path, synthetic_config):
    """The project's own model, data module and callbacks run every stage on one GPU and as DDP rank 1."""
    model, datamodule, trainer = build_all(["--config", synthetic_config, "--trainer.accelerator", "cpu"])
    verdict = audit(model, datamodule, trainer=trainer)
    ran = [(outcome.stage, outcome.rank) for outcome in verdict.outcomes]
    assert ran == [(stage, rank) for rank in (0, 1) for stage in ("fit", "validate", "test", "predict")]
    for hook in ("on_validation_epoch_end", "on_train_epoch_end", "on_fit_end", "configure_optimizers"):
        assert any(hook in action for action in verdict.hooks), hook
    assert any("RunPlots" in action for action in verdict.hooks), "the project's own callbacks ran"


def test_parameters_buffers_and_batches_need_no_placing():
    audit(Probe(nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 3))), BATCH)


# Rule 2: a tensor created inside forward takes the device of the input.


class PositionsWithoutDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1]))  # created on the CPU


class PositionsOnInputDevice(PositionsWithoutDevice):
    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1], device=x.device) + x.new_ones(x.shape[1]))


def test_tensors_created_in_forward_take_the_input_device():
    error = assert_rule(Probe(PositionsWithoutDevice()), Probe(PositionsOnInputDevice()), "# created on the CPU")
    # fit's sanity check runs validation first, as it would on a GPU.
    assert (error.kind, error.stage, error.step) == ("mixed devices", "fit", "validation_step")


class Recurrent(nn.Module):
    """An LSTM over (B, 8) features seen as sequences of 2 steps, with an initial state of zeros."""

    def __init__(self, state_on_input_device: bool) -> None:
        super().__init__()
        self.state_on_input_device = state_on_input_device
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        steps = x.view(x.shape[0], 2, 4)
        if self.state_on_input_device:
            state = (x.new_zeros(1, x.shape[0], 6), x.new_zeros(1, x.shape[0], 6))
        else:
            state = (torch.zeros(1, x.shape[0], 6), torch.zeros(1, x.shape[0], 6))
        output, _ = self.lstm(steps, state)  # PyTorch checks the state's device itself
        return self.head(output[:, -1])


def test_pytorchs_own_device_checks_are_reported_too():
    """An LSTM refuses a hidden state on another device with its own message: the audit reports it as a bug."""
    error = assert_rule(Probe(Recurrent(False)), Probe(Recurrent(True)), "# PyTorch checks the state's device")
    assert "Input and hidden tensors are not at the same device" in str(error)


# Rule 3: constants are buffers, made once in __init__.


class ConstantAsAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.scale = torch.linspace(0.5, 1.5, 8)

    def forward(self, x):
        return self.linear(x * self.scale)  # a plain attribute stays on the CPU


class ConstantAsBuffer(ConstantAsAttribute):
    def __init__(self) -> None:
        super().__init__()
        del self.scale
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8), persistent=False)


def test_constants_are_buffers():
    error = assert_rule(Probe(ConstantAsAttribute()), Probe(ConstantAsBuffer()), "# a plain attribute stays")
    assert "`net.scale`, a plain tensor attribute" in str(error)


# Rule 4: a loss holds no tensors, unless it has weights: then it is a submodule.


class WeightedLoss(Probe):
    def __init__(self, as_module: bool) -> None:
        super().__init__()
        weight = torch.tensor([1.0, 2.0, 3.0])
        self.as_module = as_module
        self.loss_fn = nn.CrossEntropyLoss(weight=weight)  # the weight is a buffer of the loss
        self.weight = weight

    def training_step(self, batch, batch_idx):
        features, labels = batch
        if self.as_module:
            return self.loss_fn(self(features), labels)
        return F.cross_entropy(self(features), labels, weight=self.weight)  # a bare weight tensor


def test_loss_weights_live_in_a_loss_module():
    assert_rule(WeightedLoss(as_module=False), WeightedLoss(as_module=True), "# a bare weight tensor")


# Rule 5: metrics are torchmetrics attributes, or in a ModuleDict: never a plain dict or list.


class MetricsIn(Probe):
    def __init__(self, container: str) -> None:
        super().__init__()
        metrics = {"val_acc": MulticlassAccuracy(3)}
        self.metrics = nn.ModuleDict(metrics) if container == "ModuleDict" else metrics

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.metrics["val_acc"].update(self(features), labels)  # update the metric


def test_metrics_are_attributes_or_in_a_module_dict():
    error = assert_rule(MetricsIn("dict"), MetricsIn("ModuleDict"), "# update the metric")
    assert error.step == "validation_step" and "kept in a plain dict" in str(error)


# Rule 6: no .cpu() or .to("cpu") inside a step, and no .numpy() of a GPU tensor.


class MovesToCPU(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        predictions = self(features).argmax(dim=1).cpu()
        hits = (predictions == labels).float().mean()  # compares CPU with GPU
        return super().training_step(batch, batch_idx) + 0 * hits


class ComparesOnDevice(MovesToCPU):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        hits = (self(features).argmax(dim=1) == labels).float().mean()
        return super(MovesToCPU, self).training_step(batch, batch_idx) + 0 * hits


def test_moving_to_the_cpu_inside_a_step_is_caught():
    assert_rule(MovesToCPU(), ComparesOnDevice(), "# compares CPU with GPU")


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
    error = assert_rule(NumpyOfAGPUTensor(), NumpyAfterCPU(), "# .numpy() of a GPU tensor")
    assert error.kind == "numpy" and "TypeError: can't convert cuda:0" in str(error)


# Rule 7: 0-dim CPU tensors may meet GPU tensors, where CUDA reads them as numbers.


class ClampsByCPUScalar(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        limit = torch.tensor(features.shape[1] - 1.0)
        return F.cross_entropy(self(features).clamp(max=limit), labels)  # clamp takes no CPU tensor


class ClampsByANumber(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        limit = features.shape[1] - 1.0
        return F.cross_entropy(self(features).clamp(max=limit), labels) * torch.tensor(0.5)


def test_zero_dim_cpu_scalars_are_allowed_where_cuda_allows_them():
    """Element-wise arithmetic takes a CPU scalar tensor on CUDA; clamp's bounds, like most arguments, do not."""
    assert_rule(ClampsByCPUScalar(), ClampsByANumber(), "# clamp takes no CPU tensor")


# Rule 1, continued: a batch type Lightning does not know moves through transfer_batch_to_device.


@dataclass
class Pair:
    features: torch.Tensor
    labels: torch.Tensor


class Opaque:  # neither a tensor, a collection nor a dataclass: Lightning cannot see inside
    def __init__(self, features, labels):
        self.features, self.labels = features, labels


class PairProbe(Probe):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch.features), batch.labels)  # an opaque batch

    def validation_step(self, batch, batch_idx):
        pass


class PairProbeWithTransfer(PairProbe):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return Pair(batch.features.to(device), batch.labels.to(device))


def test_custom_batch_types_move_through_transfer_batch_to_device():
    with pytest.raises(DevicePlacementError) as caught:
        audit(PairProbe(), Opaque(*BATCH))
    assert caught.value.lineno == line_of("# an opaque batch")
    audit(PairProbe(), Pair(*BATCH))  # dataclasses are moved field by field
    audit(PairProbeWithTransfer(), Opaque(*BATCH))


# Rule 8: epoch-end hooks run on the GPU too.


class AccumulatesOnCPU(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.total = torch.zeros(3)  # a running total per class
        self.losses = []

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.losses.append(F.cross_entropy(self(features), labels))

    def on_validation_epoch_end(self):
        self.total = self.total + torch.stack(self.losses).sum()  # a CPU running total
        self.losses.clear()


class AccumulatesInABuffer(AccumulatesOnCPU):
    def __init__(self) -> None:
        super().__init__()
        del self.total
        self.register_buffer("total", torch.zeros(3), persistent=False)

    def on_validation_epoch_end(self):
        self.total = self.total + torch.stack(self.losses).sum()
        self.losses.clear()


def test_epoch_end_hooks_keep_their_state_on_the_module():
    error = assert_rule(AccumulatesOnCPU(), AccumulatesInABuffer(), "# a CPU running total")
    assert error.step == "on_validation_epoch_end"


# Rule 9: callbacks see the module on the GPU.


class CountsOnCPU(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.seen = outputs["loss"].detach() + torch.ones(1)  # a CPU tensor in a callback

    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.log("seen", pl_module.seen)


class CountsOnTheModuleDevice(CountsOnCPU):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.seen = outputs["loss"].detach() + torch.ones(1, device=pl_module.device)


def test_callbacks_create_tensors_on_the_module_device():
    trainer = L.Trainer(callbacks=[CountsOnCPU()], logger=False)
    with pytest.raises(DevicePlacementError) as caught:
        audit(Probe(), BATCH, trainer=trainer)
    assert caught.value.lineno == line_of("# a CPU tensor in a callback")
    assert caught.value.hook == "callback CountsOnCPU.on_train_batch_end"
    audit(Probe(), BATCH, trainer=L.Trainer(callbacks=[CountsOnTheModuleDevice()], logger=False))


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
    error = assert_rule(NoisyWithCPUGenerator(), NoisyWithDeviceGenerator(), "# a CPU generator")
    assert error.kind == "generator"


# Rule 11: no device written into the code.


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


def test_no_device_is_written_into_the_code():
    error = assert_rule(WritesCuda0(), TakesTheModuleDevice(), "# a device written into the code")
    assert error.kind == "hard-coded device"
    with pytest.raises(DevicePlacementError) as caught:
        audit(CallsCuda(), BATCH)
    assert caught.value.lineno == line_of("# .cuda()")


def test_ddp_rank_1_catches_code_that_assumes_gpu_0():
    """Right on the first GPU, wrong in every other DDP process: found by the audit's second pass."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(PicksDeviceZero(), BATCH)
    error = caught.value
    assert (error.lineno, error.rank, error.kind) == (line_of("# assumes GPU 0"), 1, "another GPU")


# Rule 12: values logged with sync_dist=True stay on the GPU.


class LogsCPUWithSync(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        self.log("val/loss", loss.cpu(), sync_dist=True)  # NCCL cannot all-reduce a CPU tensor


class LogsDeviceWithSync(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        self.log("val/loss", loss, sync_dist=True)
        self.log("val/batch", float(batch_idx), sync_dist=True)
        self.log("val/gathered", self.all_gather(loss).mean())


def test_values_logged_with_sync_dist_stay_on_the_gpu():
    error = assert_rule(LogsCPUWithSync(), LogsDeviceWithSync(), "# NCCL cannot all-reduce")
    assert (error.kind, error.rank) == ("sync_dist", 1)


# Code that runs on a GPU passes: values, autograd, optimizers and hooks run for real.


class ReadsValues(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        keep = labels != 0
        rows = keep.nonzero().squeeze(1)
        if logits.abs().max().item() > 1e6:
            raise ValueError("diverged")
        return F.cross_entropy(logits[keep], labels[keep]) + 0 * logits[rows].sum() + 0 * torch.unique(labels).sum()


class UpdatesMacroAccuracy(Probe):
    """Lightning's MNIST tutorial: a metric updated with argmax predictions (torchmetrics uses unique)."""

    def __init__(self) -> None:
        super().__init__()
        self.accuracy = MulticlassAccuracy(3, average="macro")

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.accuracy.update(self(features).argmax(dim=1), labels)
        self.log("val/acc", self.accuracy)


class GradientPenalty(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        features = features.clone().requires_grad_(True)
        logits = self(features)
        (gradient,) = torch.autograd.grad(logits.sum(), features, create_graph=True)
        return F.cross_entropy(logits, labels) + (gradient.norm(dim=1) - 1).pow(2).mean()


class ManualOptimization(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(optimizer, gradient_clip_val=1.0)
        optimizer.step()


class BuildsLayersLater(Probe):
    def __init__(self) -> None:
        super().__init__(nn.Identity())

    def setup(self, stage):
        self.hidden = nn.Linear(8, 8)

    def configure_model(self):
        if isinstance(self.net, nn.Identity):
            self.net = nn.Sequential(nn.Linear(8, 3))

    def forward(self, features):
        return self.net(self.hidden(features))


class NumPyAtEpochEnd(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.predictions = []

    def validation_step(self, batch, batch_idx):
        features, _ = batch
        self.predictions.append(self(features).argmax(dim=1).cpu())

    def on_validation_epoch_end(self):
        self.log("val/zeros", float(np.mean(torch.cat(self.predictions).numpy() == 0)))
        self.predictions.clear()


class SchedulesAndCompiles(Probe):
    def configure_model(self):
        if not isinstance(self.net, torch._dynamo.OptimizedModule):
            self.net = torch.compile(self.net)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val/loss"}}


class AveragedWeights(L.Callback):
    """An exponential moving average of the weights, kept by a callback (EMA)."""

    def on_fit_start(self, trainer, pl_module):
        self.average = copy.deepcopy(pl_module.net)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            for average, weight in zip(self.average.parameters(), pl_module.net.parameters(), strict=True):
                average.lerp_(weight, 0.1)


class CheckpointsActivations(Probe):
    def forward(self, features):
        return torch.utils.checkpoint.checkpoint(self.net, features, use_reentrant=False)


class GatedRecurrent(Probe):
    def __init__(self) -> None:
        super().__init__(nn.Linear(5, 3))
        self.gru = nn.GRU(4, 5, num_layers=2, batch_first=True)

    def forward(self, features):
        output, _ = self.gru(features.view(features.shape[0], 2, 4))
        return self.net(output[:, -1])


class PinsAndLogsToTensorBoard(Probe):
    def train_dataloader(self):
        pinned = [tuple(tensor.pin_memory() for tensor in BATCH)] * 2
        return DataLoader(pinned, batch_size=None, pin_memory=True)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if isinstance(self.logger, L.pytorch.loggers.TensorBoardLogger):
            self.logger.experiment.add_histogram("val/logits", self(batch[0]), self.global_step)


@pytest.mark.parametrize(
    "model",
    [
        ReadsValues,
        UpdatesMacroAccuracy,
        GradientPenalty,
        ManualOptimization,
        BuildsLayersLater,
        NumPyAtEpochEnd,
        CheckpointsActivations,
        GatedRecurrent,
    ],
)
def test_code_that_runs_on_a_gpu_passes(model):
    """.item(), masks, nonzero, unique, autograd.grad, manual optimization, late layers, RNNs: a plain pass."""
    verdict = audit(model(), BATCH)
    assert verdict.exit_code == placement.EXIT_PASSED and not verdict.errors and not verdict.gaps


def test_own_dataloaders_pinned_memory_and_the_logger_pass():
    """A model's own (pinned) dataloaders, and its logger's own API, run as in training."""
    verdict = audit(PinsAndLogsToTensorBoard(), BATCH, trainer=L.Trainer(callbacks=[LearningRateMonitor()]))
    assert verdict.exit_code == placement.EXIT_PASSED


def test_schedulers_clipping_compile_and_ema_callbacks_pass():
    callbacks = [
        AveragedWeights(),
        EarlyStopping("val/loss"),
        StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1),
    ]
    trainer = L.Trainer(callbacks=callbacks, gradient_clip_val=0.5, accumulate_grad_batches=2, logger=False)
    verdict = audit(SchedulesAndCompiles(), BATCH, trainer=trainer)
    assert any("optimizer_step" in action for action in verdict.hooks)


# The audit itself.


class Unfinished(Probe):
    def validation_step(self, batch, batch_idx):
        raise NotImplementedError("validation comes later")  # not audited


def test_what_cannot_run_is_reported_as_not_audited():
    """An error that is not about devices gives a partial verdict naming the hook and line: never a pass."""
    with pytest.raises(AuditIncompleteError) as caught:
        audit(Unfinished(), BATCH)
    verdict = caught.value.verdict
    assert verdict.exit_code == placement.EXIT_INCOMPLETE and not verdict.errors
    assert f"test_placement.py:{line_of('# not audited')}" in verdict.gaps[0].gap
    assert "Unfinished.validation_step" in verdict.gaps[0].gap and "NotImplementedError" in verdict.gaps[0].gap


class WithTestStep(Probe):
    def test_step(self, batch, batch_idx):
        features, labels = batch
        self.log("test/loss", F.cross_entropy(self(features), labels))


class NoTestSplit(L.LightningDataModule):
    """Training and validation data, and a test loader for a test split it says it does not have."""

    def train_dataloader(self):
        return DataLoader([BATCH, BATCH], batch_size=None)

    def val_dataloader(self):
        return DataLoader([BATCH, BATCH], batch_size=None)

    def test_dataloader(self):
        raise FileNotFoundError("no test/ folder")  # not audited

    def has_data_for(self, stage):
        return stage != "test"


class BrokenTestSplit(NoTestSplit):
    def has_data_for(self, stage):
        return True


class NoTestLoader(L.LightningDataModule):
    train_dataloader = NoTestSplit.train_dataloader
    val_dataloader = NoTestSplit.val_dataloader


@pytest.mark.parametrize("data", [NoTestSplit, NoTestLoader])
def test_a_stage_the_data_has_nothing_for_is_skipped_with_a_note(data):
    """The model has a test step, the data no test split (or no test loader): audited are the stages it defines."""
    verdict = audit(WithTestStep(), data())
    assert verdict.exit_code == placement.EXIT_PASSED and not verdict.gaps
    assert {outcome.stage for outcome in verdict.outcomes} == {"fit", "validate"}
    assert f"note: test skipped: {data.__name__} has no data for it" in verdict.report()


def test_a_stage_the_data_defines_but_cannot_run_is_not_audited():
    """A data module that says it has a test split which then fails leaves a gap: exit status 3, never a pass."""
    with pytest.raises(AuditIncompleteError) as caught:
        audit(WithTestStep(), BrokenTestSplit())
    verdict = caught.value.verdict
    assert verdict.exit_code == placement.EXIT_INCOMPLETE and not verdict.skipped
    assert [outcome.stage for outcome in verdict.gaps] == ["test", "test"]
    assert "FileNotFoundError: no test/ folder" in verdict.gaps[0].gap


class SynchronizesTheGPU(Probe):
    def on_train_epoch_end(self):
        torch.cuda.synchronize()  # needs a real GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens on machines without a GPU")
def test_a_call_that_needs_a_real_gpu_is_named_as_not_audited():
    with pytest.raises(AuditIncompleteError) as caught:
        audit(SynchronizesTheGPU(), BATCH)
    gap = caught.value.verdict.gaps[0].gap
    assert "torch.cuda.synchronize(), which needs a real GPU" in gap and "SynchronizesTheGPU.on_train_epoch_end" in gap
    assert f"test_placement.py:{line_of('# needs a real GPU')}" in gap


def test_a_simulated_run_computes_what_a_cpu_run_computes():
    """The simulated GPU carries real values: two steps of training give the CPU's weights, bit for bit."""
    weights = {}
    for accelerator in ("cpu", placement.SIMULATED):
        torch.manual_seed(0)
        model = Probe(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)))
        arguments = {"strategy": placement.SimulatedGPUStrategy()} if accelerator != "cpu" else {"accelerator": "cpu"}
        trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, **arguments)
        with simulated_gpu.simulating():
            trainer.fit(model, DataLoader([BATCH, BATCH], batch_size=None))
        weights[accelerator] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert weights["cpu"].keys() == weights[placement.SIMULATED].keys()
    for name, tensor in weights["cpu"].items():
        assert torch.equal(weights[placement.SIMULATED][name], tensor), name


def test_audit_leaves_the_model_and_global_state_as_it_found_them():
    model = Probe()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng = torch.get_rng_state()
    audit(model, BATCH)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert model.device == torch.device("cpu") and model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.Generator is simulated_gpu._RealGenerator
    assert torch.get_default_device() == torch.device("cpu")


def test_the_command_line_audit_reports_every_stage(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        placement.main(["--config", synthetic_config])
    out = capsys.readouterr().out
    assert exit_info.value.code == placement.EXIT_PASSED, out
    for stage in ("fit", "validate", "test", "predict"):
        assert f"{stage} on simgpu:0 " in out and f"{stage} on simgpu:1 (DDP rank 1 of 2)" in out
    assert "the model will run on a GPU" in out
    assert not list(in_tmp_path.iterdir()), "the audit writes nothing where it runs"


{%- if cookiecutter.task == "image" %}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["flat", "train-val"])
def test_the_command_line_audit_passes_an_image_folder_without_a_test_split(in_tmp_path, layout, capsys):
    """configs/image_folder.yaml on the documented layouts without test/: fit and validate pass, exit 0,
    and the report says test and predict were skipped; with a test/ folder they are audited too."""
    from test_images import write_images

    root = in_tmp_path / "images"
    for split in ("train", "val") if layout == "train-val" else ("",):
        write_images(root / split, per_class=6)
    args = ["--config", str(PROJECT / "configs" / "image_folder.yaml"), "--data.root", str(root)]
    args += ["--data.image_size", "16", "--data.batch_size", "4"]
    with pytest.raises(SystemExit) as exit_info:
        placement.main(args)
    out = capsys.readouterr().out
    assert exit_info.value.code == placement.EXIT_PASSED, out
    assert "note: test skipped: ImageFolderDataModule has no data for it" in out
    assert "note: predict skipped: ImageFolderDataModule has no data for it" in out
    assert "validate on simgpu:1 (DDP rank 1 of 2)" in out and "test on simgpu" not in out
    assert "Every stage the data defines ran on the simulated GPUs" in out

    if layout == "train-val":
        write_images(root / "test", per_class=2)
        with pytest.raises(SystemExit) as exit_info:
            placement.main(args)
        out = capsys.readouterr().out
        assert exit_info.value.code == placement.EXIT_PASSED and "skipped" not in out, out
        assert "test on simgpu:1 (DDP rank 1 of 2)" in out and "predict on simgpu:0" in out
{%- endif %}


class PlainAttributeNet(nn.Module):
    """A network for either task's data whose output offset is a plain attribute, not a buffer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(1, num_classes)
        self.offset = torch.zeros(1)

    def forward(self, inputs):
        return self.head(inputs.float().flatten(1).mean(dim=1, keepdim=True)) + self.offset  # CPU offset


def test_the_command_line_audit_exits_1_at_a_bug(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        placement.main(["--config", synthetic_config, "--model.net", f"{__name__}.PlainAttributeNet"])
    out = capsys.readouterr().out
    assert exit_info.value.code == placement.EXIT_FAILED
    assert f"{__file__}:{line_of('# CPU offset')}" in out and "`net.offset`, a plain tensor attribute" in out


def test_a_wrong_argument_is_one_line_with_exit_2(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        placement.main(["--config", synthetic_config, "--model.lr", "fast"])
    assert exit_info.value.code == placement.EXIT_USAGE


def test_train_runs_on_the_simulated_gpu_with_the_accelerator_swapped(in_tmp_path, fast_args, capsys):
    """`train.py --accelerator simgpu` is the GPU command line, run on the simulated GPU."""
    train([*fast_args, "--accelerator", placement.SIMULATED, "--trainer.fast_dev_run", "2"])
    assert "fit finished" in capsys.readouterr().out
    buggy = ["--model.net", f"{__name__}.PlainAttributeNet"]
    with pytest.raises(SystemExit) as exit_info:
        train([*fast_args, "--accelerator", "simgpu", "--trainer.fast_dev_run", "2", *buggy])
    message = str(exit_info.value.code)
    assert message.startswith("error: this would fail on a GPU") and f"{__file__}:{line_of('# CPU offset')}" in message
    with pytest.raises(SystemExit) as exit_info:
        train([*fast_args, "--accelerator", "simgpu", "--devices", "2"])
    assert str(exit_info.value.code).startswith("error: --accelerator simgpu runs one process")


# On a real GPU: the audit's verdict is what the GPU does.

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
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_shipped_model_trains_on_a_gpu(in_tmp_path, fast_args, precision, capsys):
    train([*fast_args, "--accelerator", "gpu", "--max_epochs", "1", "--precision", precision])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


def test_the_audit_module_names_each_private_api_it_uses():
    """The simulated GPU leans on private PyTorch APIs: its docstring lists each, for upgrades."""
    doc = inspect.getdoc(simulated_gpu)
    for api in ("_setup_privateuseone_for_python_backend", "_make_wrapper_subclass", "native_functions.yaml", "_op_dk"):
        assert api in doc, api
