"""The audit's GPU memory: each stage's peak as CUDA's caching allocator counts it, and whether it fits a GPU.

The count is held against a second opinion, PyTorch's own ``MemTracker``
(``torch.distributed._tools.mem_tracker``), on the same steps run on the CPU: they agree within
CUDA's 512-byte rounding; on a real GPU (marked ``gpu``), against ``torch.cuda.max_memory_allocated``, which
adds what cuBLAS and cuDNN allocate for themselves. The largest batch that fits is a linear estimate: held
against the peak measured at twice the batch.
"""

import functools
import gc
import json

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import PROJECT
from test_placement_main import main
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from lightning_kit.gpu_audit import audit, simulated
from lightning_kit.gpu_audit.gpu_memory import GIB, MIB, judged, largest_batch, parse_capacity
from lightning_kit.gpu_audit.simulated import memory
from lightning_kit.gpu_audit.verdict import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE, Outcome, Verdict


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.Linear(1024, 10)
    )


def _embedded() -> nn.Module:
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding, self.norm, self.head = nn.Embedding(100, 64), nn.LayerNorm(64), nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.norm(self.embedding((x.abs() * 10).long() % 100)).mean(1))

    return Bag()


MODELS = {
    "mlp": (_mlp, (64, 256)),
    "cnn": (_cnn, (32, 3, 8, 8)),
    "embedding": (_embedded, (16, 12)),
}


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, between=lambda: None) -> None:
    """Two training steps: the second finds the gradients and the optimizer's state of the first."""
    for _ in range(2):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        between()


def _simulated_peak(build, shape: tuple[int, ...], optimizer: type[torch.optim.Optimizer]) -> int:
    """The audit's count of the peak of two training steps of ``build()`` on a batch of ``shape``."""
    simulated.enable()
    gc.collect()  # earlier tests' simulated tensors held in cycles: freed now, not inside the count (which they lower)
    with simulated.simulating(0):
        torch.manual_seed(0)
        memory.start_stage()
        model = build().to(simulated.device(0))
        x = torch.randn(shape, device=simulated.device(0))
        _steps(model, optimizer(model.parameters(), lr=0.01, foreach=True), x)
        return memory.stage_peak()


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
@pytest.mark.parametrize("name", MODELS)
def test_the_peak_agrees_with_pytorchs_memtracker(name, optimizer):
    """Two training steps on the simulated GPU, and the same steps on the CPU under MemTracker (the optimizer on its
    multi-tensor path, which a GPU takes): the same peak but for CUDA's rounding of each block to 512 bytes. (Where a
    GPU runs a kernel of its own, cuDNN's recurrent layers or flash attention, both count the CPU's computation.)"""
    build, shape = MODELS[name]
    ours = _simulated_peak(build, shape, optimizer)
    torch.manual_seed(0)
    model = build()
    tuned = optimizer(model.parameters(), lr=0.01, foreach=True)
    x = torch.randn(shape)
    tracker = MemTracker()
    tracker.track_external(model, tuned, x)
    with tracker:
        _steps(model, tuned, x, between=tracker.reset_mod_stats)  # MemTracker takes one iteration at a time
    theirs = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert theirs <= ours <= theirs * 1.02 + 64 * 512, (ours, theirs)


# What cuBLAS's and cuDNN's workspaces can add to CUDA's count: they are allocated through its caching allocator.
WORKSPACES = 64 * MIB


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", MODELS)
def test_on_a_gpu_the_count_is_cudas_own_but_for_its_libraries_workspaces(name, record_property):
    """The same two steps on a real GPU: ``torch.cuda.max_memory_allocated`` is the audit's count, plus what cuBLAS
    and cuDNN allocate for themselves. Recorded for the summary of ``python -m lightning_kit.gpu_check``."""
    build, shape = MODELS[name]
    ours = _simulated_peak(build, shape, torch.optim.Adam)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = build().cuda()
    x = torch.randn(shape, device="cuda")
    _steps(model, torch.optim.Adam(model.parameters(), lr=0.01, foreach=True), x)
    cuda = torch.cuda.max_memory_allocated() - start
    row = {"model": name, "steps": "2 with Adam", "audit": ours, "CUDA's max_memory_allocated": cuda}
    record_property("memory", json.dumps(row))
    assert ours <= cuda <= ours * 1.05 + WORKSPACES, row


class Wide(L.LightningModule):
    """(B, 8) features through a wide hidden layer to 3 classes: a batch's activations dominate what it needs."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 4096), nn.ReLU(), nn.Linear(4096, 3))

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self.net(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CollectingWide(Wide):
    def training_step(self, batch, batch_idx):
        gc.collect()  # the collector may run at any allocation of a stage: here, for certain
        return super().training_step(batch, batch_idx)


@functools.cache  # one audit a size for the tests here (in each xdist worker that runs them)
def _fit_outcome(batch_size: int, world_size: int = 1, model: type[Wide] = Wide) -> Outcome:
    """The audit of ``model`` on one batch of ``batch_size``: its fit on one simulated GPU (or as DDP's rank 0)."""
    verdict = audit(model(), (torch.randn(batch_size, 8), torch.randint(0, 3, (batch_size,))))
    return next(o for o in verdict.outcomes if (o.stage, o.rank, o.world_size) == ("fit", 0, world_size))


def test_each_stage_reports_its_peak_what_it_holds_and_its_batch_size():
    outcome = _fit_outcome(64)
    assert outcome.batch_size == 64
    parameters = sum(parameter.numel() * 4 for parameter in Wide().parameters())
    # Held after a step: parameters, gradients and SGD's (no) state; the peak adds a batch's activations.
    assert 2 * parameters <= outcome.held <= 2 * parameters + 64 * 1024, (outcome.held, parameters)
    assert outcome.peak > outcome.held + 64 * 4096 * 4
    # Under DDP, DistributedDataParallel's gradient buckets besides: the gradients' size again.
    ddp = _fit_outcome(64, world_size=2)
    assert 3 * parameters <= ddp.held <= 3 * parameters + 64 * 1024, (ddp.held, parameters)


def test_garbage_left_before_a_stage_and_freed_in_it_does_not_lower_its_peak():
    """Simulated tensors that only the collector frees (held in a cycle), left by earlier work, are freed before a
    stage's count starts: freed inside it, they would lower the peak by their size."""
    clean = _fit_outcome(64)  # Wide's: the same tensors, the same peak
    simulated.enable()
    gc.disable()  # the garbage stays until the stage, whatever the collector's thresholds
    try:
        with simulated.simulating(0):
            left = [torch.zeros(4 * MIB, device=simulated.device(0))]  # 16 MiB
            left.append(left)
        del left
        littered = _fit_outcome(64, model=CollectingWide)
    finally:
        gc.enable()
    assert littered.peak == clean.peak, (littered.peak, clean.peak)


def test_the_largest_batch_estimate_holds_at_twice_the_batch():
    small, double = _fit_outcome(32), _fit_outcome(64)
    predicted = small.held + 2 * (small.peak - small.held)
    assert abs(predicted - double.peak) <= 0.1 * double.peak, (predicted, double.peak)
    capacity = double.peak + 600 * MIB + 8 * MIB
    assert largest_batch(small, capacity) >= 60


@pytest.mark.parametrize(
    ("given", "size"),
    [("24GB", 24 * GIB), ("24 GiB", 24 * GIB), ("16000MB", 16000 * MIB), ("a10g", 24 * GIB), ("A100-80GB", 80 * GIB)],
)
def test_a_gpu_is_given_by_its_size_or_its_name(given, size):
    assert parse_capacity(given) == size


@pytest.mark.parametrize("given", ["", "24", "lots", "-3GB", "0GB", "24TB", "RTX9999"])
def test_a_gpu_memory_that_is_no_size_is_refused_naming_what_is_accepted(given):
    with pytest.raises(ValueError, match=r"is neither a size .* nor a GPU this knows .*A10G"):
        parse_capacity(given)


def test_the_command_says_whether_each_stage_fits_and_exits_1_where_one_does_not(in_tmp_path, capsys):
    config = ["--config", str(PROJECT / "configs" / "synthetic.yaml")]
    with pytest.raises(SystemExit) as stop:
        main([*config, "--gpu_memory", "A10G"])
    out = capsys.readouterr().out
    assert stop.value.code == EXIT_PASSED, out
    assert "On a GPU of 24.0 GiB" in out and out.count(": fits (a batch of about") == 12, out
    with pytest.raises(SystemExit) as stop:
        main([*config, "--gpu_memory=610MB"])
    out = capsys.readouterr().out
    assert stop.value.code == EXIT_FAILED, out
    assert "DOES NOT FIT" in out and "CUDA would stop with 'CUDA out of memory'. Fix: a batch of at most about" in out
    with pytest.raises(SystemExit) as stop:
        main([*config, "--gpu_memory", "huge"])
    assert stop.value.code == EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: --gpu_memory 'huge' is neither a size")


def test_judged_without_a_stage_run_says_nothing_fails():
    lines, fits = judged(Verdict(), 1 * GIB)
    assert fits and len(lines) == 1
