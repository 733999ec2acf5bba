"""The rules of docs/device-placement.md, each as a small LightningModule written the wrong way and the right way.

``audit(model, batch)`` (lightning-kit's device audit) trains the model with Lightning's own
Trainer on a simulated CUDA GPU that computes on the CPU: ``fit`` (sanity check, every hook,
backward, optimizer), ``validate``, ``test`` and ``predict``, then all of it again as the second
process of a two-GPU DDP run. The wrong way raises ``DevicePlacementError`` at the very line a
real GPU would stop at, the line marked ``# rule N, wrong`` below; the right way passes every
stage. Read a rule's two classes side by side, and copy the right one.

Audit your own model the same way in a test of its own (see ``test_training.py``), or from the
command line, with train.py's arguments:

    python -m {{ cookiecutter.project_slug }}.placement --config configs/synthetic.yaml
"""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import HANG_GUARD_S, PROJECT
from lightning_kit import DevicePlacementError, audit
from lightning_kit.gpu_audit.gpu_memory import judged
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torchmetrics.classification import MulticlassAccuracy

# One batch of 8 examples of 8 features and 3 classes: the audit trains on it over and over.
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


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker``."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def stops_at(marker: str, model: L.LightningModule, data=BATCH, **audit_args) -> DevicePlacementError:
    """The audit of ``model`` stops at the line holding ``marker``, as a GPU would; returns what it says."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(model, data, **audit_args)
    assert (caught.value.filename, caught.value.lineno) == (__file__, line_of(marker)), str(caught.value)
    return caught.value


def passes(model: L.LightningModule, data=BATCH, **audit_args) -> None:
    """The audit of ``model`` trains and evaluates it on one simulated GPU and as each process of a DDP run."""
    verdict = audit(model, data, **audit_args)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("fit", 1)}


# Rule 1: the model and the batches: nothing to do. Lightning moves every parameter and buffer, and
# every batch of tensors, lists, dicts and dataclasses. A batch of a type of your own moves in
# transfer_batch_to_device, the one place where `.to(device)` belongs.


def test_rule_1_the_model_and_the_batches_need_no_placing():
    passes(Probe(nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 3))))  # BatchNorm's running statistics are buffers


@dataclass
class Pair:
    features: torch.Tensor
    labels: torch.Tensor


class Opaque:
    """Neither a tensor, a collection nor a dataclass: Lightning cannot see inside it."""

    def __init__(self, features, labels):
        self.features, self.labels = features, labels


class TakesAPair(Probe):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch.features), batch.labels)  # rule 1, wrong: an opaque batch stays put

    def validation_step(self, batch, batch_idx):
        pass


class MovesItsOwnBatch(TakesAPair):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return Opaque(batch.features.to(device), batch.labels.to(device))


def test_rule_1_a_batch_of_your_own_type_moves_in_transfer_batch_to_device():
    stops_at("# rule 1, wrong", TakesAPair(), Opaque(*BATCH))
    passes(TakesAPair(), Pair(*BATCH))  # a dataclass is moved field by field
    passes(MovesItsOwnBatch(), Opaque(*BATCH))


# Rule 2: a tensor made inside forward takes the input's device.


class PositionsOnTheCPU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1]))  # rule 2, wrong: made on the CPU


class PositionsBesideTheInput(PositionsOnTheCPU):
    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1], device=x.device) + x.new_ones(x.shape[1]))


def test_rule_2_a_tensor_made_in_forward_takes_the_inputs_device():
    error = stops_at("# rule 2, wrong: made on the CPU", Probe(PositionsOnTheCPU()))
    # fit's sanity check runs validation first, as it would on a GPU.
    assert (error.kind, error.stage, error.step) == ("mixed devices", "fit", "validation_step")
    passes(Probe(PositionsBesideTheInput()))


class Recurrent(nn.Module):
    """An LSTM over (B, 8) features seen as sequences of 2 steps of 4, from an initial state of zeros."""

    def __init__(self, state_beside_the_input: bool) -> None:
        super().__init__()
        self.state_beside_the_input = state_beside_the_input
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        steps = x.view(x.shape[0], 2, 4)
        if self.state_beside_the_input:
            state = (x.new_zeros(1, x.shape[0], 6), x.new_zeros(1, x.shape[0], 6))
        else:
            state = (torch.zeros(1, x.shape[0], 6), torch.zeros(1, x.shape[0], 6))
        output, _ = self.lstm(steps, state)  # rule 2, wrong when the state was made on the CPU
        return self.head(output[:, -1])


def test_rule_2_an_initial_state_takes_the_inputs_device():
    """PyTorch checks an LSTM's state itself, with its own message: the audit reports that as a bug too."""
    error = stops_at("# rule 2, wrong when the state", Probe(Recurrent(state_beside_the_input=False)))
    assert "Input and hidden tensors are not at the same device" in str(error)
    passes(Probe(Recurrent(state_beside_the_input=True)))


# Rule 3: a constant is a buffer, registered once in __init__.


class ScaleAsAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.scale = torch.linspace(0.5, 1.5, 8)

    def forward(self, x):
        return self.linear(x * self.scale)  # rule 3, wrong: a plain attribute stays on the CPU


class ScaleAsBuffer(ScaleAsAttribute):
    def __init__(self) -> None:
        super().__init__()
        del self.scale
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8), persistent=False)


def test_rule_3_constants_are_buffers():
    error = stops_at("# rule 3, wrong", Probe(ScaleAsAttribute()))
    assert "`net.scale`, a plain tensor attribute" in str(error)  # the audit names the attribute
    passes(Probe(ScaleAsBuffer()))


# Rule 4: a loss with weights is a submodule, so its weight moves with the model.


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
        return F.cross_entropy(self(features), labels, weight=self.weight)  # rule 4, wrong: a bare weight


def test_rule_4_loss_weights_live_in_a_loss_module():
    stops_at("# rule 4, wrong", WeightedLoss(as_module=False))
    passes(WeightedLoss(as_module=True))


# Rule 5: metrics are torchmetrics objects held as attributes, or in a ModuleDict; never a plain dict or list.


class MetricsIn(Probe):
    def __init__(self, container: type) -> None:
        super().__init__()
        self.metrics = container({"val_acc": MulticlassAccuracy(3)})

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.metrics["val_acc"].update(self(features), labels)  # rule 5, wrong in a plain dict


def test_rule_5_metrics_are_attributes_or_in_a_module_dict():
    error = stops_at("# rule 5, wrong", MetricsIn(dict))
    assert error.step == "validation_step" and "kept in a plain dict" in str(error)
    passes(MetricsIn(nn.ModuleDict))


# Rule 6: no .cpu(), .cuda(), .to(device) or .numpy() in a step.


class ComparesOnTheCPU(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        predictions = self(features).argmax(dim=1).cpu()
        hits = (predictions == labels).float().mean()  # rule 6, wrong: CPU against GPU
        return super().training_step(batch, batch_idx) + 0 * hits


class ComparesWhereTheyAre(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        hits = (self(features).argmax(dim=1) == labels).float().mean()
        return super().training_step(batch, batch_idx) + 0 * hits


def test_rule_6_nothing_moves_to_the_cpu_inside_a_step():
    stops_at("# rule 6, wrong: CPU against GPU", ComparesOnTheCPU())
    passes(ComparesWhereTheyAre())


class NumpyOf(Probe):
    def __init__(self, copy_first: bool) -> None:
        super().__init__()
        self.copy_first = copy_first

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        predicted = logits.argmax(dim=1).detach()
        if self.copy_first:
            predicted = predicted.cpu()  # where NumPy is needed: a CPU copy, once
        self.share = float(np.mean(predicted.numpy() == 0))  # rule 6, wrong: .numpy() of a GPU tensor
        return F.cross_entropy(logits, labels)


def test_rule_6_numpy_needs_a_cpu_copy():
    error = stops_at("# rule 6, wrong: .numpy()", NumpyOf(copy_first=False))
    assert error.kind == "numpy" and "TypeError: can't convert cuda:0" in str(error)
    passes(NumpyOf(copy_first=True))


# Rule 7: a 0-dimensional CPU tensor meets GPU tensors only where CUDA reads it as a number.


class ClampsByACPUTensor(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        limit = torch.tensor(7.0)
        return F.cross_entropy(self(features).clamp(max=limit), labels)  # rule 7, wrong: clamp's bound


class ClampsByANumber(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        # A number for clamp; a 0-dimensional CPU tensor in arithmetic, which CUDA takes.
        return F.cross_entropy(self(features).clamp(max=7.0), labels) * torch.tensor(0.5)


def test_rule_7_cpu_scalars_only_where_cuda_reads_them_as_numbers():
    stops_at("# rule 7, wrong", ClampsByACPUTensor())
    passes(ClampsByANumber())


# Rule 8: epoch-end hooks run on the GPU too: state kept across batches is a buffer or a metric.


class TotalOnTheCPU(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.total = torch.zeros(3)
        self.losses = []

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.losses.append(F.cross_entropy(self(features), labels))

    def on_validation_epoch_end(self):
        self.total = self.total + torch.stack(self.losses).sum()  # rule 8, wrong: a CPU running total
        self.losses.clear()


class TotalInABuffer(TotalOnTheCPU):
    def __init__(self) -> None:
        super().__init__()
        del self.total
        self.register_buffer("total", torch.zeros(3), persistent=False)


def test_rule_8_epoch_end_hooks_keep_their_state_on_the_module():
    assert stops_at("# rule 8, wrong", TotalOnTheCPU()).step == "on_validation_epoch_end"
    passes(TotalInABuffer())


# Rule 9: a callback's tensors take the module's device, pl_module.device.


class CountsOnTheCPU(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.seen = outputs["loss"].detach() + torch.ones(1)  # rule 9, wrong: a CPU tensor in a callback

    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.log("seen", pl_module.seen)


class CountsOnTheModulesDevice(CountsOnTheCPU):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.seen = outputs["loss"].detach() + torch.ones(1, device=pl_module.device)


def test_rule_9_callbacks_make_tensors_on_the_modules_device():
    """``audit(..., trainer=...)`` runs the Trainer's callbacks too."""
    error = stops_at("# rule 9, wrong", Probe(), trainer=L.Trainer(callbacks=[CountsOnTheCPU()], logger=False))
    assert error.hook == "callback CountsOnTheCPU.on_train_batch_end"
    passes(Probe(), trainer=L.Trainer(callbacks=[CountsOnTheModulesDevice()], logger=False))


# Rule 10: a random generator belongs to the device it draws for.


class NoisyWith(Probe):
    def __init__(self, generator_on_the_device: bool) -> None:
        super().__init__()
        self.generator_on_the_device = generator_on_the_device

    def training_step(self, batch, batch_idx):
        features, labels = batch
        if self.generator_on_the_device:
            generator = torch.Generator(device=features.device).manual_seed(batch_idx)
        else:
            generator = torch.Generator().manual_seed(batch_idx)
        noise = torch.randn(features.shape, device=features.device, generator=generator)  # rule 10, wrong: CPU's
        return F.cross_entropy(self(features + noise), labels)


def test_rule_10_generators_are_made_on_the_device_they_draw_for():
    assert stops_at("# rule 10, wrong", NoisyWith(generator_on_the_device=False)).kind == "generator"
    passes(NoisyWith(generator_on_the_device=True))


# Rule 11: no device written into the code; take it from the data or the module. (The audit's simulated GPU is
# CUDA to your code: "cuda:0" is the first process's GPU, and another process's in every other DDP process.)


class WritesCuda0(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        offset = torch.zeros(3, device="cuda:0")  # rule 11, wrong: a device written in
        return F.cross_entropy(self(features) + offset, labels)


class TakesTheModulesDevice(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features) + torch.zeros(3, device=self.device), labels)


class PicksGPU0(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        device = torch.device(features.device.type, 0)
        return F.cross_entropy(self(features + torch.zeros(8, device=device)), labels)  # rule 11, wrong: GPU 0


def test_rule_11_no_device_is_written_into_the_code():
    """cuda:0 is right in DDP's first process and another process's GPU in the second, which the audit plays too."""
    error = stops_at("# rule 11, wrong: a device written in", WritesCuda0())
    assert (error.rank, error.kind) == (1, "another GPU")
    passes(TakesTheModulesDevice())


def test_rule_11_the_second_ddp_process_catches_code_that_assumes_gpu_0():
    """Right on the first GPU, wrong in every other process of a DDP run: the audit's pass as DDP rank 1 finds it."""
    error = stops_at("# rule 11, wrong: GPU 0", PicksGPU0())
    assert (error.rank, error.kind) == (1, "another GPU")


def lint(*paths: str) -> subprocess.CompletedProcess:
    """``python -m lightning_kit.lint_placement paths`` in the project's folder: the pre-commit hook's check."""
    return subprocess.run(
        [sys.executable, "-m", "lightning_kit.lint_placement", *paths],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_S,
    )


def test_rules_6_and_11_this_projects_code_places_nothing_by_hand(tmp_path):
    """No .cuda(), .cpu(), .to(device) or device written in anywhere in src/ or train.py; such a line is named."""
    done = lint()  # no paths: src/ and train.py
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def forward(x, mask):\n    return x * mask.cuda()\n")
    done = lint(str(wrong))
    assert done.returncode == 1 and done.stdout.startswith(f"{wrong}:2: "), done.stdout + done.stderr


# Rule 12: values logged with sync_dist=True stay on the GPU (NCCL all-reduces GPU tensors only).


class LogsACPUCopy(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        self.log("val/loss", loss.cpu(), sync_dist=True)  # rule 12, wrong: NCCL cannot all-reduce a CPU tensor


class LogsWhereItIs(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        self.log("val/loss", loss, sync_dist=True)
        self.log("val/batch", float(batch_idx), sync_dist=True)  # a Python number: Lightning places it
        self.log("val/gathered", self.all_gather(loss).mean())


def test_rule_12_values_logged_with_sync_dist_stay_on_the_gpu():
    error = stops_at("# rule 12, wrong", LogsACPUCopy())
    assert (error.kind, error.rank) == ("sync_dist", 0)
    passes(LogsWhereItIs())


# Rule 13: lengths and sizes that PyTorch reads on the host are CPU tensors.


class PackedLSTM(Probe):
    """An LSTM over (B, 8) features seen as sequences of 2 steps of 4, packed by their lengths."""

    def __init__(self, lengths_on_the_host: bool) -> None:
        super().__init__(nn.Linear(6, 3))
        self.lengths_on_the_host = lengths_on_the_host
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, features):
        steps = features.view(features.shape[0], 2, 4)  # (batch, time, feature)
        lengths = 1 + (features[:, 0] > 0).long()  # computed from the batch, so on the GPU
        if self.lengths_on_the_host:
            lengths = lengths.cpu()  # the one .cpu() that belongs in a step: PyTorch reads these on the host
        packed = pack_padded_sequence(steps, lengths, batch_first=True, enforce_sorted=False)  # rule 13, wrong
        output, _ = self.lstm(packed)
        padded, _ = pad_packed_sequence(output, batch_first=True, total_length=2)
        return self.net(padded.sum(dim=1))


def test_rule_13_packed_sequences_take_their_lengths_on_the_cpu():
    error = stops_at("# rule 13, wrong", PackedLSTM(lengths_on_the_host=False))
    assert "'lengths' argument should be a 1D CPU int64 tensor" in str(error)
    passes(PackedLSTM(lengths_on_the_host=True))


# Rule 14: every device index your code can read is its own process's GPU.


class ClipsAndTotals(Probe):
    def __init__(self, total_in_a_buffer: bool) -> None:
        super().__init__()
        if total_in_a_buffer:
            self.register_buffer("norms", torch.zeros(1), persistent=False)
        else:
            self.norms = torch.zeros(1)

    def on_before_optimizer_step(self, optimizer):
        # clip_grad_norm_ groups the gradients by their device: each rank's own GPU in the DDP passes.
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.norms = self.norms + norm  # rule 14, wrong when the total is on the CPU


def test_rule_14_code_that_takes_its_device_from_pytorch_is_right_in_every_process():
    passes(ClipsAndTotals(total_in_a_buffer=True))
    assert stops_at("# rule 14, wrong", ClipsAndTotals(total_in_a_buffer=False)).rank == 0


# Rule 15: under mixed precision and autocast, tensors that meet autocast's results take their dtype.


class FillsZeros(Probe):
    def __init__(self, of_the_logits_dtype: bool) -> None:
        super().__init__()
        self.of_the_logits_dtype = of_the_logits_dtype

    def forward(self, features):
        with torch.autocast(device_type=features.device.type, dtype=torch.float16):  # the device from the data
            logits = self.net(features)  # float16, as CUDA's autocast runs a linear layer
            if self.of_the_logits_dtype:
                kept = logits.new_zeros(features.shape[0], 3)
            else:
                kept = torch.zeros(features.shape[0], 3, device=features.device)  # float32
            kept[features[:, 0] > 0] = logits[features[:, 0] > 0]  # rule 15, wrong into float32 zeros
        return kept.float()


def test_rule_15_tensors_that_meet_autocasts_results_take_their_dtype():
    error = stops_at("# rule 15, wrong into", FillsZeros(of_the_logits_dtype=False))
    assert error.kind == "dtype" and "dtypes match" in str(error)
    passes(FillsZeros(of_the_logits_dtype=True))


class BinaryCrossEntropyOf(Probe):
    def __init__(self, logits: bool) -> None:
        super().__init__()
        self.logits = logits

    def training_step(self, batch, batch_idx):
        features, labels = batch
        targets = F.one_hot(labels, 3).float()
        if self.logits:
            return F.binary_cross_entropy_with_logits(self(features), targets)
        return F.binary_cross_entropy(torch.sigmoid(self(features)), targets)  # rule 15, wrong under autocast


def bf16_mixed() -> L.Trainer:
    """A Trainer whose settings the audit takes: mixed precision, bfloat16."""
    return L.Trainer(precision="bf16-mixed", logger=False)


def test_rule_15_binary_cross_entropy_under_mixed_precision_takes_logits():
    """CUDA's autocast refuses ``binary_cross_entropy``, though the CPU's allows it: the audit plays CUDA's."""
    error = stops_at("# rule 15, wrong under", BinaryCrossEntropyOf(logits=False), trainer=bf16_mixed())
    assert error.kind == "autocast" and "binary_cross_entropy_with_logits" in str(error)  # the fix, named
    passes(BinaryCrossEntropyOf(logits=True), trainer=bf16_mixed())


# Rule 16: collectives of torch.distributed take tensors on the process's GPU.


class CountsExamples(Probe):
    def __init__(self, on_the_device: bool) -> None:
        super().__init__()
        self.on_the_device = on_the_device

    def training_step(self, batch, batch_idx):
        features, labels = batch
        if dist.is_initialized():  # only under DDP: the audit's DDP passes have a process group
            seen = torch.tensor([float(len(labels))], device=self.device if self.on_the_device else None)
            dist.all_reduce(seen)  # rule 16, wrong with a CPU tensor: NCCL takes GPU tensors only
        return F.cross_entropy(self(features), labels)


def test_rule_16_collectives_take_tensors_on_the_processs_gpu():
    error = stops_at("# rule 16, wrong", CountsExamples(on_the_device=False))
    assert (error.kind, error.rank, error.operation) == ("collective", 0, "torch.distributed.all_reduce")
    passes(CountsExamples(on_the_device=True))


# Rule 17: gradients you hand to autograd are on the device of their tensor (0-dim ones are moved).


class PenalisesGradients(Probe):
    """A gradient penalty: the per-example losses' gradient with respect to the weights, from ones."""

    def __init__(self, like_the_losses: bool) -> None:
        super().__init__()
        self.like_the_losses = like_the_losses

    def training_step(self, batch, batch_idx):
        features, labels = batch
        losses = F.cross_entropy(self(features), labels, reduction="none")
        ones = torch.ones_like(losses) if self.like_the_losses else torch.ones(losses.shape[0])
        (grad,) = torch.autograd.grad(losses, [self.net.weight], grad_outputs=ones, create_graph=True)  # rule 17, wrong
        return losses.mean() + grad.pow(2).sum()


def test_rule_17_gradients_handed_to_autograd_are_made_like_their_tensor():
    error = stops_at("# rule 17, wrong", PenalisesGradients(like_the_losses=False))
    assert "invalid gradient at index 0" in str(error)
    passes(PenalisesGradients(like_the_losses=True))


# Rule 18: a tensor built from GPU scalars with torch.tensor is made on the CPU; stack them instead.


class WeighsLosses(Probe):
    def __init__(self, stacked: bool) -> None:
        super().__init__()
        self.stacked = stacked

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        parts = [F.cross_entropy(logits, labels), logits.pow(2).mean()]
        weights = torch.stack(parts).detach().softmax(0) if self.stacked else torch.tensor(parts).softmax(0)
        return (weights * torch.stack(parts)).sum()  # rule 18, wrong with weights built by torch.tensor


def test_rule_18_tensors_built_from_gpu_scalars_are_stacked_on_their_device():
    stops_at("# rule 18, wrong", WeighsLosses(stacked=False))
    passes(WeighsLosses(stacked=True))


# Rule 19: lazy modules materialise where their module was moved; under DDP, before Lightning moves it.


class LazyProbe(Probe):
    def __init__(self, dry_run_on: str | None) -> None:
        super().__init__(nn.LazyLinear(3))
        self.dry_run_on = dry_run_on

    def setup(self, stage):
        if self.dry_run_on == "setup":
            self.net(torch.zeros(2, 8))  # on the CPU, before Lightning moves the model and DDP wraps it

    def configure_optimizers(self):
        if self.dry_run_on == "cpu":
            self.net(torch.zeros(2, 8))  # rule 19, wrong: the weights materialise on the GPU, the input is on the CPU
        elif self.dry_run_on == "module":
            self.net(torch.zeros(2, 8, device=self.device))
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_rule_19_lazy_modules_materialise_on_the_modules_device_before_ddp_wraps_them():
    stops_at("# rule 19, wrong", LazyProbe(dry_run_on="cpu"))
    passes(LazyProbe(dry_run_on="setup"))
    for after_the_move in ("module", None):  # right on one GPU; DDP wraps the model before either
        with pytest.raises(DevicePlacementError) as caught:
            audit(LazyProbe(dry_run_on=after_the_move), BATCH)
        assert (caught.value.kind, caught.value.rank) == ("lazy modules", 0)
        assert "uninitialized: net.weight, net.bias" in str(caught.value)


# Rule 20: deterministic mode stops at a kernel CUDA has no deterministic implementation of; the CPU runs them all.


class Segments(Probe):
    """A class for each pixel of (B, 2, 2, 2) images: a segmentation model's cross entropy."""

    def __init__(self, reduction: str) -> None:
        super().__init__(nn.Conv2d(2, 3, 1))
        self.reduction = reduction

    def training_step(self, batch, batch_idx):
        features, labels = batch
        maps = self(features.view(-1, 2, 2, 2))
        masks = labels[:, None, None].expand(-1, 2, 2)
        losses = F.cross_entropy(maps, masks, reduction=self.reduction)  # rule 20, wrong where it averages
        return losses.mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.training_step(batch, batch_idx))


@pytest.fixture
def deterministic():
    """A Trainer(deterministic=True), which turns PyTorch's deterministic mode on; off again after the test."""
    yield L.Trainer(deterministic=True, logger=False, enable_checkpointing=False)
    torch.use_deterministic_algorithms(False)


def test_rule_20_deterministic_mode_needs_operations_cuda_has_deterministic_kernels_for(deterministic):
    error = stops_at("# rule 20, wrong", Segments(reduction="mean"), trainer=deterministic)
    assert error.kind == "deterministic" and "nll_loss2d_forward_out_cuda_template" in str(error)
    passes(Segments(reduction="none"), trainer=deterministic)  # per-pixel losses, averaged by .mean()


# Rule 21: a GPU holds the model, its optimizer's state and a batch's activations at once.


def test_rule_21_a_batch_too_large_for_the_gpu_is_found_before_renting_one():
    wide = Probe(nn.Sequential(nn.Linear(8, 4096), nn.ReLU(), nn.Linear(4096, 3)))
    large, small = (torch.randn(512, 8), torch.randint(0, 3, (512,))), BATCH
    gpu = 620 * 2**20  # a GPU that leaves about 20 MiB for tensors, once CUDA has taken its share
    lines, fits = judged(audit(wide, large), gpu)
    assert not fits and "Fix: a batch of at most about" in lines[-1]  # rule 21, wrong: 512 examples a batch
    lines, fits = judged(audit(wide, small), gpu)
    assert fits, lines


# Rule 22: under DDP, every trainable parameter reaches the loss of each step.


class AuxiliaryHead(Probe):
    """A second head, used to validate only, unless trained or frozen."""

    def __init__(self, used: str) -> None:
        super().__init__()
        self.aux = nn.Linear(8, 3)
        self.used = used
        if used == "frozen":
            self.aux.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features) + (0.1 * self.aux(features) if self.used == "trained" else 0)
        return F.cross_entropy(logits, labels)  # rule 22, wrong where the loss does not reach self.aux

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.log("val/loss", F.cross_entropy(self(features) + self.aux(features), labels))


def test_rule_22_under_ddp_every_trainable_parameter_reaches_the_loss():
    with pytest.raises(DevicePlacementError) as caught:
        audit(AuxiliaryHead(used="validation"), BATCH)
    assert (caught.value.kind, caught.value.rank) == ("unused parameters", 0)
    assert "did not receive grad: aux.bias, aux.weight" in str(caught.value)
    passes(AuxiliaryHead(used="trained"))
    passes(AuxiliaryHead(used="frozen"))


# Rule 23: a backward pass through an RNN, LSTM or GRU needs training mode on a GPU.


class RecurrentCritic(Probe):
    """A frozen recurrent critic that the loss flows through, in eval mode or in training mode."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.critic = nn.GRU(3, 4, batch_first=True).requires_grad_(False)
        self.mode = mode

    def on_train_epoch_start(self):
        self.critic.train(self.mode == "train")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        judged, _ = self.critic(logits.unsqueeze(1))  # rule 23, wrong in eval mode: cuDNN has no backward for it
        return F.cross_entropy(logits, labels) + judged.mean()


def test_rule_23_a_backward_pass_through_an_rnn_needs_training_mode():
    error = stops_at("# rule 23, wrong", RecurrentCritic(mode="eval"))
    assert error.kind == "cudnn RNN" and "can only be called in training mode" in str(error)
    passes(RecurrentCritic(mode="train"))
