"""The placement rules of the placement guide about where tensors are, each shown wrong and right.

The simulated GPU (``gpu_audit/simulated/``) computes real values on the CPU and applies
CUDA's rules for devices; the audit trains a model on it with Lightning's own Trainer: fit
(every hook, backward, optimizer), validate, test and predict, then all again as rank 0 and rank 1 of
a DDP run. Each rule below has a test in which the wrong version stops at the line a GPU
would stop at, and the right version passes. The rules about what the code says (a device
written in, a generator, ``.numpy()``) are in ``test_code_checks.py``; ``test_real_gpu.py``
runs the same versions on a real GPU and checks that it agrees with the audit.
"""

import inspect
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import HANG_GUARD_S
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_kit.gpu_audit import DevicePlacementError, audit, simulated

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


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


def line_of(marker: str, path: str = __file__) -> int:
    """The line of ``path`` (this file unless given) that holds ``marker``."""
    lines = Path(path).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def assert_rule(
    wrong: L.LightningModule, right: L.LightningModule, marker: str, path: str = __file__, **audit_args
) -> DevicePlacementError:
    """The wrong version stops at the line of ``path`` holding ``marker``; the right version passes every stage."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(wrong, BATCH, **audit_args)
    error = caught.value
    assert (error.filename, error.lineno) == (path, line_of(marker, path)), str(error)
    verdict = audit(right, BATCH, **audit_args)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("fit", 1)}
    return error


# Rule 1: Lightning places the model (parameters and buffers) and the batch.


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


# Rule 7, continued: indexing takes indices on the host (x[:, index]); index_select does not.


class SelectsByHostIndex(Probe):
    """The features in reverse order, picked by an index made on the host."""

    def forward(self, features):
        index = torch.arange(features.shape[1] - 1, -1, -1)
        return self.net(self.pick(features, index))

    def pick(self, features, index):
        return features.index_select(1, index)  # index_select takes no host index


class IndexesByHostIndex(SelectsByHostIndex):
    def pick(self, features, index):
        return features[:, index]


def test_host_indices_index_but_do_not_select():
    error = assert_rule(SelectsByHostIndex(), IndexesByHostIndex(), "# index_select takes no host index")
    assert "argument index in method wrapper_CUDA__index_select" in str(error)


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
    assert (error.kind, error.rank) == ("sync_dist", 0)


# Rule 18: a tensor built from GPU scalars (torch.tensor([a, b])) is made on the CPU, as CUDA makes it.


class WeighsByHostValues(Probe):
    """Two losses, weighted by a softmax of their own values (no gradient through the weights)."""

    def weights(self, parts):
        return torch.tensor(parts)  # built from GPU scalars: on the CPU

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        parts = [F.cross_entropy(logits, labels), logits.pow(2).mean()]
        weights = self.weights(parts).softmax(0)
        return (weights * torch.stack(parts)).sum()  # host weights meet the GPU's losses


class WeighsByDeviceValues(WeighsByHostValues):
    def weights(self, parts):
        return torch.tensor(parts, device=self.device) + torch.stack(parts).detach() * 0


def test_tensors_built_from_gpu_scalars_are_made_on_the_host():
    error = assert_rule(WeighsByHostValues(), WeighsByDeviceValues(), "# host weights meet the GPU's losses")
    assert error.kind == "mixed devices"
    with simulated.simulating(0):
        scalars = [torch.tensor(1.5, device=simulated.device(0)), torch.tensor(2.5, device=simulated.device(0))]
        builds = {"cpu": (torch.tensor, torch.as_tensor, torch.Tensor), "cuda": (scalars[0].new_tensor,)}
        for expected, ways in builds.items():
            for build in ways:
                built = build(scalars)
                assert (built.device.type, built.tolist()) == (expected, [1.5, 2.5]), build
        assert torch.tensor(scalars, device=simulated.device(0)).device == simulated.cuda_device(0)


def test_the_audit_module_names_each_private_api_it_uses():
    """The simulated GPU leans on private PyTorch APIs: its docstring lists each, for upgrades."""
    doc = inspect.getdoc(simulated)
    for api in (
        "_setup_privateuseone_for_python_backend",
        "_make_wrapper_subclass",
        "_InferenceMode",
        "DisableTorchFunction",
        "native_functions.yaml",
        "_op_dk",
        "OpOverload.decompose",
        "AutogradPrivateUse1",
        "_group_tensors_by_device_and_dtype",
        "_current_autograd_node",
        "_engine_run_backward",
        "swap_tensors",
        "_foreach_supported_types",
    ):
        assert api in doc, api


AFTER_ANYTHING = """import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_kit.gpu_audit import DevicePlacementError, audit, simulated
from lightning_kit.gpu_audit.simulated import backend

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Probe(L.LightningModule):
    def __init__(self, wrong=False):
        super().__init__()
        self.net, self.wrong = nn.Linear(8, 3), wrong

    def training_step(self, batch, batch_idx):
        logits = self.net(batch[0])
        if self.wrong:
            logits = logits + torch.ones(3)  # a CPU tensor
        return F.cross_entropy(logits, batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


quiet = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
L.Trainer(accelerator="cpu", max_steps=2, **quiet).fit(Probe(), DataLoader([BATCH] * 2, batch_size=None))
print("trained on the CPU, backward passes included")
registering = backend.composite_kernels
def fails():
    raise RuntimeError("registration failed")
backend.composite_kernels = fails
try:
    simulated.enable()
except RuntimeError as err:
    print(f"enable failed: {err}")
backend.composite_kernels = registering
simulated.enable()
simulated.enable()
for attempt in (1, 2):
    try:
        audit(Probe(wrong=True), BATCH)
    except DevicePlacementError as err:
        print(f"audit {attempt}: bug at line {err.lineno}")
    print(f"audit {attempt}: right model exit status {audit(Probe(), BATCH).exit_code}")
"""


@pytest.mark.slow
def test_the_simulated_gpu_sets_up_after_anything_the_process_ran(tmp_path):
    """CPU training with backward passes, a failed set-up, a second set-up, one audit after another: each audit
    finds the bug at its line and passes the right model (the simulated GPU's backward passes run on the thread
    that starts them, so the autograd engine's count of devices, made at the first backward, does not matter)."""
    script = tmp_path / "after_anything.py"
    script.write_text(AFTER_ANYTHING)
    run = subprocess.run(
        [sys.executable, str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert run.returncode == 0, run.stdout + run.stderr
    bug_line = next(n for n, line in enumerate(AFTER_ANYTHING.splitlines(), 1) if "# a CPU tensor" in line)
    assert [line for line in run.stdout.splitlines() if not line.startswith("`Trainer")] == [
        "trained on the CPU, backward passes included",
        "enable failed: registration failed",
        f"audit 1: bug at line {bug_line}",
        "audit 1: right model exit status 0",
        f"audit 2: bug at line {bug_line}",
        "audit 2: right model exit status 0",
    ], run.stdout + run.stderr
