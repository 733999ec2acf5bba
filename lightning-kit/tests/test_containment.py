"""No user code ends the auditing process: what stops inside PyTorch's C++ comes back to Python as a verdict.

PyTorch calls the simulated GPU's Python code from C++; in a backward pass an exception left there
ended the process (SIGABRT, "terminate called without an active exception"). Each way in is tried
here in a process of its own (a regression would kill it, not this test session): the operations of
the engine's own nodes, a tensor hook, a module's backward hook, a hook after gradient accumulation,
the checks on code inside a hook (NumPy, a CUDA device written in), a hook that raises, and the
simulated GPU's tensors outside an audit. What a GPU refuses is a bug at its line; what it raises
too is not audited, at its line. What cannot be kept from ending a process (``os.abort()``) ends a
forked copy of it: ``audit(isolate=True)`` and the audit's command report it as not audited, naming
the signal and the hook.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S

from lightning_kit.gpu_audit import EXIT_INCOMPLETE, simulated
from lightning_kit.gpu_audit.simulated import containment

CASES = """import os
import torch
import torch.nn.functional as F
import lightning as L
from torch import nn
from lightning_kit.gpu_audit import AuditIncompleteError, DevicePlacementError, audit, simulated

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Case(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self.net(features)
        self.inside(logits)
        return F.cross_entropy(logits, labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class HostOnes(Case):
    def inside(self, logits):
        rows = logits.sum(1)
        torch.autograd.grad(rows, [self.net.weight], grad_outputs=torch.ones(8), retain_graph=True)  # host ones


class TensorHook(Case):
    def inside(self, logits):
        logits.register_hook(lambda grad: grad * torch.ones(8, 3))  # tensor hook


class ModuleHook(Case):
    def inside(self, logits):
        if not self.net._backward_hooks:
            self.net.register_full_backward_pre_hook(lambda m, go: (go[0] * torch.ones(8, 3),))  # module hook


class AccumulatedHook(Case):
    def inside(self, logits):
        if not self.net.weight._post_accumulate_grad_hooks:
            self.net.weight.register_post_accumulate_grad_hook(lambda p: p.grad.add_(torch.ones(3, 8)))  # accumulated


class NumpyInAHook(Case):
    def inside(self, logits):
        logits.register_hook(lambda grad: print(grad.numpy().shape))  # numpy in a hook


class CudaInAHook(Case):
    def inside(self, logits):
        logits.register_hook(lambda grad: grad + torch.zeros(3, device="cuda:1"))  # another GPU in a hook


class RaisingHook(Case):
    def inside(self, logits):
        logits.register_hook(self.refuse)

    def refuse(self, grad):
        raise KeyError("refused")  # a hook that raises


for case in (HostOnes, TensorHook, ModuleHook, AccumulatedHook, NumpyInAHook, CudaInAHook, RaisingHook):
    try:
        audit(case(), BATCH)
        print(f"{case.__name__}: passed", flush=True)
    except DevicePlacementError as err:
        print(f"{case.__name__}: {err.kind} at line {err.lineno}", flush=True)
    except AuditIncompleteError as err:
        print(f"{case.__name__}: not audited: {err.verdict.gaps[0].gap}", flush=True)

# The simulated GPU's tensors outside an audit: under simulating(), and with the device only enabled.
simulated.enable()
for where in ("simulating", "enabled"):
    weight = simulated.SimulatedTensor(torch.randn(3, 4)).requires_grad_()
    rows = (simulated.SimulatedTensor(torch.randn(5, 4)) @ weight.T).sum(1)
    try:
        if where == "simulating":
            with simulated.simulating(0):
                torch.autograd.grad(rows, [weight], grad_outputs=torch.ones(5))
        else:
            rows.register_hook(lambda grad: grad * torch.ones(5))
            rows.sum().backward()
            weight * 2  # the next operation
        print(f"{where}: nothing raised", flush=True)
    except simulated.SimulatedDeviceError as err:
        print(f"{where}: {err}", flush=True)
"""


def line(marker: str) -> int:
    return next(number for number, text in enumerate(CASES.splitlines(), 1) if marker in text)


@pytest.mark.slow
def test_no_way_into_the_simulated_gpu_from_cpp_ends_the_process(tmp_path):
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    found = [text for text in run.stdout.splitlines() if ":" in text and not text.startswith(("(", "`"))]
    assert found == [
        f"HostOnes: root gradient at line {line('# host ones')}",
        f"TensorHook: mixed devices at line {line('# tensor hook')}",
        f"ModuleHook: mixed devices at line {line('# module hook')}",
        f"AccumulatedHook: mixed devices at line {line('# accumulated')}",
        f"NumpyInAHook: numpy at line {line('# numpy in a hook')}",
        f"CudaInAHook: another GPU at line {line('# another GPU in a hook')}",
        "RaisingHook: not audited: RaisingHook.training_step (backward) stopped at "
        f"cases.py:{line('# a hook that raises')}: KeyError: 'refused'",
        "simulating: invalid gradient at index 0 - expected device cuda:0 but got cpu",
        "enabled: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
    ], run.stdout + run.stderr[-3000:]


class KeepsWhatItRaises(torch.autograd.Function):
    """A node of a backward pass that calls a contained entry point, as C++ calls the simulated GPU's."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.returned = refusing(grad)
        return grad


@containment.contained()
def refusing(grad):
    raise simulated.SimulatedDeviceError("refused in C++'s call", kind="mixed devices", operation="test")


def test_an_entry_point_keeps_what_it_raises_in_a_backward_pass_and_python_raises_it_after():
    """Inside the pass the entry point returns ``STOP`` (which C++ refuses with its own error); the kept exception
    is raised at the next call outside it. Outside a backward pass it raises as any function does."""
    x = torch.ones(3, requires_grad=True)
    KeepsWhatItRaises.apply(x).sum().backward()  # nothing raised inside
    assert containment._kept
    with pytest.raises(simulated.SimulatedDeviceError, match="refused in C"):
        containment.raise_kept()
    assert not containment._kept
    with pytest.raises(simulated.SimulatedDeviceError):
        refusing(x)


ABORTS = """import os

import torch
import torch.nn.functional as F
import lightning as L
from torch import nn

from lightning_kit.gpu_audit import AuditIncompleteError, audit, run_audit

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Probe(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Aborts(Probe):
    def training_step(self, batch, batch_idx):
        os.abort()  # a C++ abort, which nothing in the process survives


verdict = run_audit(Aborts(), BATCH, isolate=True)
print(f"exit status {verdict.exit_code}, {len(verdict.errors)} bugs")
for outcome in verdict.gaps:
    print(f"{outcome.stage} {outcome.rank}: {outcome.gap}")
try:
    audit(Aborts(), BATCH, isolate=True)
except AuditIncompleteError as err:
    print(f"audit: {err.verdict.gaps[0].gap}")
print(f"and this process goes on: {audit(Probe(), BATCH, isolate=True).exit_code}")
"""


@pytest.mark.slow
def test_an_audit_whose_process_dies_is_not_audited_naming_the_signal_and_the_hook(tmp_path):
    """In a process of its own: a forked audit needs one whose autograd engine has not run (PyTorch refuses a
    backward pass in a child forked after that); where it has, the audit runs in the process itself."""
    script = tmp_path / "aborts.py"
    script.write_text(ABORTS)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    run = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "TMPDIR": str(temporary)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.splitlines()[-4:] == [
        "exit status 3, 0 bugs",
        "fit 0: the process died with SIGABRT in Aborts.training_step",
        "audit: the process died with SIGABRT in Aborts.training_step",
        "and this process goes on: 0",
    ], run.stdout
    # The dead child's temporary run folders went with it: the parent removes the folder it gave the child.
    assert not [path.name for path in temporary.iterdir() if path.name.startswith("placement-audit-")]


ABORTING_PROJECT = """import os

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Aborts(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        if self.global_step == 1:
            os.abort()
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Batches(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader([BATCH] * 2, batch_size=None)
"""


@pytest.mark.slow
def test_the_audit_command_reports_a_process_that_died_and_exits_3(tmp_path):
    (tmp_path / "aborting.py").write_text(ABORTING_PROJECT)
    run = subprocess.run(
        [sys.executable, "-m", "lightning_kit.placement", "--model", "aborting.Aborts", "--data", "aborting.Batches"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == EXIT_INCOMPLETE, run.stdout + run.stderr
    assert "NOT AUDITED fit on simgpu:0: the process died with SIGABRT in Aborts.training_step" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert {path.name for path in Path(tmp_path).iterdir()} <= {"aborting.py", "__pycache__"}, "it writes nothing here"
