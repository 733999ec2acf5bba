"""The audit's runner: every stage the model and data define, with the Trainer's settings, leaving no trace.

Code that runs on a GPU passes the audit as a plain pass: values, autograd, optimizers,
hooks, callbacks and the Trainer's settings run for real. A stage the data has nothing for
is skipped with a note; one that fails for another reason is a gap, never a pass. The audit
trains the model itself and leaves it, and the process's global state, as it found them.
"""

import copy
import subprocess
import sys

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import HANG_GUARD_S, build_all
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, StochasticWeightAveraging
from test_simulated_gpu import BATCH, Probe
from torch import nn
from torch.nn.parameter import UninitializedParameter
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

from lightning_kit.gpu_audit import EXIT_INCOMPLETE, EXIT_PASSED, AuditIncompleteError, audit, run_audit, simulated
from lightning_kit.gpu_audit.audit import PASSES


def test_shipped_model_and_data_pass_the_audit(in_tmp_path, synthetic_config, capsys):
    """The project's own model, data module and callbacks run every stage on one GPU and as each rank of DDP."""
    model, datamodule, trainer = build_all(["--config", synthetic_config, "--trainer.accelerator", "cpu"])
    verdict = audit(model, datamodule, trainer=trainer)
    assert repr(verdict) == f"<Verdict passed: 12 stages run, {len(verdict.hooks)} hooks, exit status 0>"
    printed = capsys.readouterr().out
    assert "predictions for" not in printed, "the audit named a file in the folder it removes"
    ran = [(outcome.stage, outcome.rank, outcome.world_size) for outcome in verdict.outcomes]
    assert ran == [(stage, *each) for each in PASSES for stage in ("fit", "validate", "test", "predict")]
    for hook in ("on_validation_epoch_end", "on_train_epoch_end", "on_fit_end", "configure_optimizers"):
        assert any(hook in action for action in verdict.hooks), hook
    assert any("RunStatus" in action for action in verdict.hooks), "the project's own callbacks ran"


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
    assert verdict.exit_code == EXIT_PASSED and not verdict.errors and not verdict.gaps


def test_own_dataloaders_pinned_memory_and_the_logger_pass():
    """A model's own (pinned) dataloaders, and its logger's own API, run as in training."""
    verdict = audit(PinsAndLogsToTensorBoard(), BATCH, trainer=L.Trainer(callbacks=[LearningRateMonitor()]))
    assert verdict.exit_code == EXIT_PASSED


def test_schedulers_clipping_compile_and_ema_callbacks_pass():
    callbacks = [
        AveragedWeights(),
        EarlyStopping("val/loss"),
        StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1),
    ]
    trainer = L.Trainer(callbacks=callbacks, gradient_clip_val=0.5, accumulate_grad_batches=2, logger=False)
    verdict = audit(SchedulesAndCompiles(), BATCH, trainer=trainer)
    assert any("optimizer_step" in action for action in verdict.hooks)


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
    assert verdict.exit_code == EXIT_PASSED and not verdict.gaps
    assert {outcome.stage for outcome in verdict.outcomes} == {"fit", "validate"}
    assert f"note: test skipped: {data.__name__} has no data for it" in verdict.report()


def test_a_stage_the_data_defines_but_cannot_run_is_not_audited():
    """A data module that says it has a test split which then fails leaves a gap: exit status 3, never a pass."""
    with pytest.raises(AuditIncompleteError) as caught:
        audit(WithTestStep(), BrokenTestSplit())
    verdict = caught.value.verdict
    assert verdict.exit_code == EXIT_INCOMPLETE and not verdict.skipped
    assert [outcome.stage for outcome in verdict.gaps] == ["test", "test", "test"]  # one GPU, DDP's two ranks
    assert "FileNotFoundError: no test/ folder" in verdict.gaps[0].gap


HOOK_RAN_ON: list[str] = []  # the device of each gradient the hook below was given


class BuiltOnItsParameters(Probe):
    """What a user builds on the model itself: a hook and an attribute on a parameter, a layer made in setup, a lazy
    layer materialised there (before DDP wraps the model)."""

    def __init__(self, wrong: bool = False) -> None:
        super().__init__(nn.Sequential(nn.Linear(8, 8), nn.LazyLinear(3)))
        self.wrong = wrong
        self.first = self.net[0].weight
        self.first.no_decay = True
        self.first.register_hook(lambda grad: HOOK_RAN_ON.append(grad.device.type) or grad)
        self.counter = torch.zeros(1)

    def setup(self, stage):
        self.extra = nn.Linear(3, 3).requires_grad_(False)  # unused: frozen, as DDP requires
        self.net(torch.zeros(2, 8))

    def training_step(self, batch, batch_idx):
        self.counter += 1
        loss = super().training_step(batch, batch_idx)
        return loss + (torch.ones(1) if self.wrong and batch_idx == 1 else 0)  # fails on the second batch


@pytest.mark.parametrize("wrong", [False, True])
def test_audit_gives_back_the_very_model_it_trained(wrong):
    """The same parameter objects with their values, attributes and hooks; no module or attribute added; a lazy
    layer uninitialised again; a plain tensor changed in place put back: after a pass and after a bug alike."""
    model = BuiltOnItsParameters(wrong)
    parameters = dict(model.named_parameters())
    before = {name: value.detach().clone() for name, value in parameters.items() if "net.1" not in name}
    attributes = set(vars(model))
    HOOK_RAN_ON.clear()
    verdict = run_audit(model, BATCH)
    assert bool(verdict.errors) == wrong and "cuda" in HOOK_RAN_ON, "the hook on the parameter ran on the GPU"
    assert dict(model.named_parameters()) == parameters and model.first is model.net[0].weight
    assert all(
        torch.equal(before[name], parameters[name]) and type(parameters[name]) is nn.Parameter for name in before
    )
    assert model.first.no_decay and set(vars(model)) == attributes and "log" not in vars(model)
    assert isinstance(model.net[1], nn.LazyLinear) and isinstance(model.net[1].weight, UninitializedParameter)
    assert not hasattr(model, "extra") and model._trainer is None and torch.equal(model.counter, torch.zeros(1))
    HOOK_RAN_ON.clear()
    F.cross_entropy(model(BATCH[0]), BATCH[1]).backward()
    assert HOOK_RAN_ON == ["cpu"] and model.first.grad is not None, "the hook is still there, on the CPU"


def test_audit_leaves_the_model_and_global_state_as_it_found_them():
    model = Probe()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng = torch.get_rng_state()
    audit(model, BATCH)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert model.device == torch.device("cpu") and model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.Generator is simulated.code_checks._RealGenerator
    assert torch.get_default_device() == torch.device("cpu")


class SetsTheDefaultDevice(Probe):
    def on_fit_start(self):
        torch.set_default_device(self.device)  # the simulated GPU, while the audit runs


def test_a_default_device_the_model_sets_is_not_left_behind():
    """Whatever the model's code did to the default device, a model made after the audit is on the CPU."""
    run_audit(SetsTheDefaultDevice(), BATCH)
    assert torch.get_default_device() == torch.device("cpu") and Probe().net.weight.device.type == "cpu"


class SaliencyInValidation(Probe):
    """Autograd in evaluation, as Lightning documents it: a Trainer with ``inference_mode=False``."""

    def validation_step(self, batch, batch_idx):
        features = batch[0].clone().requires_grad_(True)
        with torch.enable_grad():
            (saliency,) = torch.autograd.grad(self(features).sum(), features)
        self.log("val/saliency", saliency.abs().mean())


def test_the_trainers_inference_mode_is_the_audits():
    trainer = L.Trainer(inference_mode=False, logger=False, enable_checkpointing=False)
    verdict = audit(SaliencyInValidation(), BATCH, trainer=trainer)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("validate", 1)}


SESSION = """import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_kit.gpu_audit import DevicePlacementError, audit

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Probe(L.LightningModule):
    def __init__(self, wrong=False):
        super().__init__()
        self.net, self.wrong = nn.Linear(8, 3), wrong

    def training_step(self, batch, batch_idx):
        logits = self.net(batch[0])
        return F.cross_entropy(logits + torch.ones(3) if self.wrong else logits, batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_team_trains_on_the_cpu_first():
    quiet = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    L.Trainer(accelerator="cpu", max_steps=2, **quiet).fit(Probe(), DataLoader([BATCH] * 2, batch_size=None))


@pytest.mark.parametrize("attempt", [1, 2])
def test_and_audits_afterwards(attempt):
    with pytest.raises(DevicePlacementError):
        audit(Probe(wrong=True), BATCH)
    assert audit(Probe(), BATCH).exit_code == 0
"""


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["on", "off"])
def test_a_test_session_that_trains_on_the_cpu_first_audits_afterwards(tmp_path, plugin):
    """A project's test session: CPU training (backward passes) in one test, audits in the next ones; with the
    library's pytest plugin, and without it (the simulated GPU then sets itself up at the first audit)."""
    (tmp_path / "test_session.py").write_text(SESSION)
    off = ["-p", "no:lightning_kit.pytest_plugin"] if plugin == "off" else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *off, "test_session.py"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr
