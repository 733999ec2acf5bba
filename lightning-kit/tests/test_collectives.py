"""Rule 16 of the placement guide: ``torch.distributed`` collectives take tensors on the process's GPU.

As the second process of a two-GPU DDP run, the audit has a process group
(``gpu_audit/simulated/collectives.py``): in this one process, on an in-memory store, with
NCCL's device rule. Code that calls ``torch.distributed`` itself (inside an
``is_initialized()`` guard, say) is run, and a CPU tensor given to a collective stops at its line.
"""

from typing import ClassVar

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only
from test_simulated_gpu import BATCH, Probe, assert_rule
from torch.utils.data import DataLoader
from torchmetrics import CatMetric
from torchmetrics.classification import MulticlassAccuracy

from lightning_kit.gpu_audit import DevicePlacementError, SimulatedGPUStrategy, audit, simulated
from lightning_kit.gpu_audit.simulated import SimulatedDeviceError
from lightning_kit.gpu_audit.simulated.collectives import process_group


class CountsOnTheCPU(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        if dist.is_initialized():
            seen = torch.tensor([float(len(labels))])
            dist.all_reduce(seen)  # NCCL takes GPU tensors only
        return F.cross_entropy(self(features), labels)


class CountsOnTheDevice(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        if dist.is_initialized():
            seen = torch.tensor([float(len(labels))], device=self.device)
            dist.all_reduce(seen)
            gathered = [torch.zeros_like(seen) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, seen)
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, dist.get_rank())
            dist.barrier()
        return F.cross_entropy(self(features), labels)


def test_a_host_tensor_given_to_a_collective_is_caught_at_its_line():
    """A CPU tensor given to ``all_reduce`` under an ``is_initialized()`` guard stops in DDP's rank 0, as NCCL does."""
    error = assert_rule(CountsOnTheCPU(), CountsOnTheDevice(), "# NCCL takes GPU tensors only", __file__)
    assert (error.kind, error.rank, error.operation) == ("collective", 0, "torch.distributed.all_reduce")
    assert "No backend type associated with device type cpu" in str(error)


class RecordsTheProcessGroup(Probe):
    seen: ClassVar[list[tuple]] = []

    def training_step(self, batch, batch_idx):
        initialized = dist.is_initialized()
        self.seen.append((initialized, dist.get_rank(), dist.get_world_size()) if initialized else (initialized,))
        return super().training_step(batch, batch_idx)


def test_the_ddp_pass_has_a_process_group_and_the_single_gpu_pass_none():
    """One GPU: torch.distributed uninitialized; rank 1 of 2: initialized as that rank; afterwards: as before."""
    RecordsTheProcessGroup.seen = []
    audit(RecordsTheProcessGroup(), BATCH)
    assert {RecordsTheProcessGroup.seen[0], RecordsTheProcessGroup.seen[-1]} == {(False,), (True, 1, 2)}
    assert not dist.is_initialized()


class SyncsMetricsAndLogs(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.val_acc = MulticlassAccuracy(num_classes=3)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.val_acc.update(logits, labels)
        self.log("val/loss", F.cross_entropy(logits, labels), sync_dist=True)
        self.log("val/gathered", self.all_gather(logits.sum()).mean())

    def on_validation_epoch_end(self):
        self.log("val/acc", self.val_acc.compute())  # torchmetrics all-gathers its state under DDP
        self.val_acc.reset()


def test_lightning_and_torchmetrics_collectives_pass_on_the_gpu():
    """sync_dist, self.all_gather and a metric's own sync, all on the module's device, pass both passes."""
    verdict = audit(SyncsMetricsAndLogs(), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 1), ("validate", 1)}


class LogsOnRankZeroOnly(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        if self.trainer.is_global_zero:  # Lightning syncs no value logged with rank_zero_only=True
            self.log("val/loss", F.cross_entropy(self(features), labels), sync_dist=True, rank_zero_only=True)


def test_a_value_logged_on_rank_zero_only_is_not_a_collective():
    verdict = audit(LogsOnRankZeroOnly(), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 1), ("validate", 1)}


COLLECTIVES = {
    "all_reduce": lambda t: dist.all_reduce(t),
    "all_reduce async": lambda t: dist.all_reduce(t, async_op=True).wait(),
    "all_gather": lambda t: dist.all_gather([torch.zeros_like(t), torch.zeros_like(t)], t),
    "all_gather_into_tensor": lambda t: dist.all_gather_into_tensor(t.new_zeros(2 * t.numel()), t),
    "broadcast": lambda t: dist.broadcast(t, src=0),
    "reduce": lambda t: dist.reduce(t, dst=0),
    "reduce_scatter_tensor": lambda t: dist.reduce_scatter_tensor(t.new_zeros(t.numel() // 2), t),
    "all_to_all_single": lambda t: dist.all_to_all_single(torch.zeros_like(t), t),
}


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_takes_gpu_tensors_and_refuses_host_ones(collective):
    """Each collective completes at once on a tensor of the process's GPU, and refuses a CPU tensor as NCCL does."""
    run = COLLECTIVES[collective]
    with process_group(1, 2), simulated.simulating(1):
        run(torch.ones(4, device=simulated.device(1)))
        with pytest.raises(SimulatedDeviceError) as caught:
            run(torch.ones(4))
    assert caught.value.kind == "collective"
    assert not dist.is_initialized()


def test_a_sum_is_what_every_process_holding_the_same_values_would_get():
    """all_reduce sums over both processes; all_gather gathers one copy from each; barrier returns at once."""
    with process_group(1, 2), simulated.simulating(1):
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (1, 2, "simnccl")
        values = torch.tensor([1.0, 2.0], device=simulated.device(1))
        dist.all_reduce(values)
        gathered = [torch.zeros_like(values), torch.zeros_like(values)]
        dist.all_gather(gathered, values)
        dist.barrier()
        assert values.tolist() == [2.0, 4.0]
        assert [tensor.tolist() for tensor in gathered] == [[2.0, 4.0], [2.0, 4.0]]


def test_a_run_as_the_second_process_gives_this_process_its_rank_back(tmp_path):
    """SimulatedGPUStrategy(1, 2) plays rank 1 while it runs; after it, a run in the same process is rank 0 again
    and writes what rank 0 writes (its logs: metrics.csv)."""
    quiet = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    batches = [DataLoader([BATCH, BATCH], batch_size=None)] * 2
    second = L.Trainer(strategy=SimulatedGPUStrategy(1, 2), max_steps=2, limit_val_batches=2, logger=False, **quiet)
    with process_group(1, 2), simulated.simulating(1):
        second.fit(CountsOnTheDevice(), *batches)
    assert rank_zero_only.rank == 0
    logger = CSVLogger(tmp_path, name="after")
    L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=2, logger=logger, **quiet).fit(Probe(), *batches)
    assert (tmp_path / "after" / "version_0" / "metrics.csv").is_file()


class WatchedMetricOnRankZeroOnly(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        if self.trainer.is_global_zero:
            self.log("val/loss", F.cross_entropy(self(features), labels))


@pytest.mark.parametrize(
    "callback", [EarlyStopping(monitor="val/loss"), ModelCheckpoint(monitor="val/loss")], ids=lambda c: type(c).__name__
)
def test_a_metric_a_callback_watches_that_one_rank_does_not_log_is_a_bug_of_that_rank(callback):
    """Rank 1 of a DDP run has no value for the callback to watch: the run stops there, as on two GPUs."""
    trainer = L.Trainer(callbacks=[callback], logger=False, enable_checkpointing=isinstance(callback, ModelCheckpoint))
    with pytest.raises(DevicePlacementError) as caught:
        audit(WatchedMetricOnRankZeroOnly(), BATCH, trainer=trainer)
    assert (caught.value.kind, caught.value.rank, caught.value.stage) == ("collective mismatch", 1, "fit")


class GathersWhatDiffersByRank(Probe):
    """Gathers of sizes that differ by rank, through functions that pad to the largest first."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = CatMetric()

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.kept.update(self(features)[: 2 + self.global_rank, 0])  # more rows on rank 1
        self.log("val/loss", F.cross_entropy(self(features), labels))

    def on_validation_epoch_end(self):
        gathered = [None] * self.trainer.world_size
        if dist.is_initialized():
            dist.all_gather_object(gathered, list(range(self.global_rank + 1)))
        self.log("val/kept", self.kept.compute().mean())
        self.kept.reset()


def test_gathers_that_pad_to_the_largest_size_first_pass():
    """torch.distributed.all_gather_object and a torchmetrics metric gather every rank's sizes and pad to the
    largest: on GPUs each process gathers tensors of one shape, though each holds a different number of values."""
    verdict = audit(GathersWhatDiffersByRank(), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 1), ("validate", 1)}
