"""What the audit can reach, and what it says where it cannot: never a pass for code that did not run.

A stage that ran no step (an empty split) is not audited. The wrong kind of argument is a ``TypeError`` saying what
``audit()`` takes. Placement a GPU refuses outside the dispatch of one operation is still found: a custom
``autograd.Function`` whose backward returns a gradient on another device, an operation inside a TorchScript
function (whose interpreter loses the exception), sparse tensors of every layout. What the audit's own machinery
cannot do is "not audited", naming why; nothing escapes ``audit()`` but a verdict or its two errors.
"""

import subprocess
import sys
import threading
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import HANG_GUARD_S
from lightning.pytorch.strategies import DDPStrategy
from test_simulated_gpu import BATCH, Probe
from test_simulated_gpu import line_of as line_in
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_kit.gpu_audit import AuditIncompleteError, DevicePlacementError, audit, run_audit

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning"),
]
MIXED = ("cuda:0 and cpu", "cpu and cuda:0")


def line_of(marker: str) -> int:
    return line_in(marker, __file__)


def pairs(count: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(count, 8), torch.randint(0, 3, (count,))), batch_size=4)


class Splits(L.LightningDataModule):
    """A data module with a training, validation and test split of the given sizes (0: empty)."""

    def __init__(self, train: int = 8, val: int = 8, test: int = 8) -> None:
        super().__init__()
        self.sizes = {"train": train, "val": val, "test": test}

    def train_dataloader(self):
        return pairs(self.sizes["train"])

    def val_dataloader(self):
        return pairs(self.sizes["val"])

    def test_dataloader(self):
        return pairs(self.sizes["test"])


class WithTestStep(Probe):
    def test_step(self, batch, batch_idx):
        self.log("test/loss", F.cross_entropy(self(batch[0]), batch[1]))


class OwnEmptyLoader(Probe):
    """Its own training dataloader, over a list that was never filled."""

    def train_dataloader(self):
        return DataLoader([], batch_size=4)


class Filtered(torch.utils.data.IterableDataset):
    """An iterable split whose filter kept nothing: its length is unknown until it is read."""

    def __iter__(self):
        return iter([row for row in zip(torch.randn(8, 8), torch.randint(0, 3, (8,)), strict=True) if False])


class IterableEmpty(Probe):
    def train_dataloader(self):
        return DataLoader(Filtered(), batch_size=4)


@pytest.mark.parametrize(
    "model, data, stages",
    [
        (Probe(), Splits(train=0), ["fit"]),
        (OwnEmptyLoader(), None, ["fit"]),
        (IterableEmpty(), None, ["fit"]),
        (WithTestStep(), Splits(test=0), ["test"]),
    ],
    ids=["empty-train-split", "own-empty-loader", "iterable-that-yields-nothing", "empty-test-split"],
)
def test_a_stage_that_ran_no_step_is_not_audited(model, data, stages):
    """Each pass's stage that ran no step is a gap naming the step, the dataloader and why; audit() raises
    AuditIncompleteError (exit 3), never a verdict that the model will run on a GPU."""
    verdict = run_audit(model, data)
    gaps = [outcome for outcome in verdict.gaps]
    assert [(outcome.stage, outcome.rank) for outcome in gaps] == [
        (stage, rank) for rank in (0, 0, 1) for stage in stages
    ]
    step = {"fit": "training_step", "test": "test_step"}[stages[0]]
    assert f"ran no {step}" in gaps[0].gap and "yielded no batch" in gaps[0].gap, gaps[0].gap
    assert verdict.exit_code == 3
    with pytest.raises(AuditIncompleteError):
        audit(model, data)


class CpuConstant(Probe):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]) + torch.ones(3), batch[1])  # a CPU tensor


def test_an_empty_training_split_hides_no_bug_it_would_find():
    """The same model is a bug on data, and not audited (rather than passed) on an empty training split."""
    with pytest.raises(DevicePlacementError):
        audit(CpuConstant(), Splits())
    with pytest.raises(AuditIncompleteError):
        audit(CpuConstant(), Splits(train=0))


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return pairs(8)


@pytest.mark.parametrize(
    "arguments, said",
    [
        ((None,), "takes a LightningModule instance, not None"),
        (("model.py",), "takes a LightningModule instance, not a str"),
        ((Probe,), "not the class Probe: construct it first, Probe(...)"),
        ((nn.Linear(8, 3),), "not a plain Linear (torch.nn.Module): wrap it in a LightningModule"),
        ((Data(), Probe()), "the two are swapped"),
        ((Probe(), Data), "data is a LightningDataModule instance or one batch, not the class Data"),
        ((Probe(), Probe()), "not a second LightningModule"),
        ((Probe(), None, {"trainer": "gpu"}), "trainer is a lightning.Trainer or None, not a str"),
        ((Probe(), None, {"trainer": L.Trainer}), "trainer is a lightning.Trainer or None, not the class Trainer"),
    ],
    ids=[
        "none",
        "string",
        "class",
        "plain-module",
        "swapped",
        "data-class",
        "two-models",
        "trainer-str",
        "trainer-class",
    ],
)
def test_the_wrong_kind_of_argument_is_one_line_saying_what_audit_takes(arguments, said):
    positional = [argument for argument in arguments if not isinstance(argument, dict)]
    keywords = next((argument for argument in arguments if isinstance(argument, dict)), {})
    for function in (audit, run_audit):
        with pytest.raises(TypeError) as caught:
            function(*positional, **keywords)
        assert said in str(caught.value) and "\n" not in str(caught.value), caught.value


class HoldsALock(Probe):
    """A model that cannot be copied: Lightning never copies it, and nor does the audit."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_a_model_that_cannot_be_copied_is_audited_as_it_is():
    model = HoldsALock()
    lock = model.lock
    verdict = run_audit(model, BATCH)
    assert verdict.exit_code == 0 and {outcome.rank for outcome in verdict.outcomes} == {0, 1}
    assert model.lock is lock


# Custom autograd Functions: CUDA's engine checks the device of each gradient a backward returns.


class GradientToCpu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # function: GradientToCpu.backward
        return (grad * 2).cpu()


class SecondGradientFromNumpy(torch.autograd.Function):
    """Two inputs; the second's gradient is made anew by NumPy, on the CPU."""

    @staticmethod
    def forward(ctx, x, scale, label):
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):  # function: SecondGradientFromNumpy.backward
        x, scale = ctx.saved_tensors
        return grad * scale, torch.from_numpy((grad * x).sum(0).detach().cpu().numpy()), None


class RightGradients(torch.autograd.Function):
    """Gradients on the input's device, and a 0-dim CPU one, which CUDA moves itself."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.clone(), torch.tensor(float((grad * x).sum()))


class UsesFunction(Probe):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function
        # Only the parameter the function uses trains: DDP requires every trainable one to reach the loss.
        self.scale = nn.Parameter(torch.ones(3), requires_grad=function is SecondGradientFromNumpy)
        self.weight = nn.Parameter(torch.tensor(1.0), requires_grad=function is RightGradients)

    def forward(self, features):
        logits = self.net(features)
        if self.function is GradientToCpu:
            return GradientToCpu.apply(logits)
        if self.function is SecondGradientFromNumpy:
            return SecondGradientFromNumpy.apply(logits, self.scale, "label")
        return RightGradients.apply(logits, self.weight)


@pytest.mark.parametrize("function", [GradientToCpu, SecondGradientFromNumpy], ids=["cpu", "numpy-second-input"])
def test_a_functions_backward_that_returns_a_gradient_on_another_device_is_found_at_its_backward(function):
    with pytest.raises(DevicePlacementError) as caught:
        audit(UsesFunction(function), BATCH)
    found = caught.value
    index = 0 if function is GradientToCpu else 1
    assert f"returned an invalid gradient at index {index} - expected device cuda:0 but got cpu" in str(found)
    assert found.operation == f"{function.__name__}.backward" and found.hook.endswith("(backward)")
    assert found.lineno == line_of(f"# function: {function.__name__}.backward"), str(found)


def test_a_function_whose_gradients_are_on_the_inputs_devices_passes():
    assert audit(UsesFunction(RightGradients), BATCH).exit_code == 0


# TorchScript: its interpreter turns the operation's exception into one of its own, without the message.


@torch.jit.script
def add_positions(x: torch.Tensor) -> torch.Tensor:
    return x + torch.arange(x.shape[-1]).to(x.dtype)  # script: positions on the CPU


@torch.jit.script
def add_positions_on_device(x: torch.Tensor) -> torch.Tensor:
    return x + torch.arange(x.shape[-1], device=x.device).to(x.dtype)


class ScriptedMask(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(torch.zeros(x.shape, dtype=torch.bool), 0.0)  # script: mask on the CPU


class Scripted(Probe):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.mask = torch.jit.script(ScriptedMask()) if kind == "module" else None

    def forward(self, features):
        logits = self.net(features)
        if self.kind == "function":
            return add_positions(logits)
        if self.kind == "module":
            return self.mask(logits)
        return add_positions_on_device(logits)


@pytest.mark.parametrize(
    "kind, marker",
    [("function", "# script: positions on the CPU"), ("module", "# script: mask on the CPU")],
    ids=["script-function", "script-module"],
)
def test_a_tensor_a_torchscript_function_makes_without_a_device_is_a_bug_at_its_line(kind, marker):
    with pytest.raises(DevicePlacementError) as caught:
        audit(Scripted(kind), BATCH)
    found = str(caught.value)
    assert caught.value.lineno == line_of(marker) and any(mixed in found for mixed in MIXED), found


def test_a_torchscript_function_that_makes_its_tensors_on_the_inputs_device_passes():
    assert audit(Scripted("on-device"), BATCH).exit_code == 0


class HoldsScripted(Probe):
    """A compiled function kept as an attribute (``self.act = torch.jit.script(f)``): no pickling, no deepcopy."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = torch.jit.script(function)
        self.held = {"also": [self.function]}  # and inside a container

    def forward(self, features):
        return self.held["also"][0](self.function(self.net(features)))


@pytest.mark.parametrize(
    "function, marker",
    [(add_positions, "# script: positions on the CPU"), (add_positions_on_device, None)],
    ids=["cpu-positions", "on-device"],
)
def test_a_model_holding_a_compiled_function_is_audited(function, marker):
    """The audit trains a copy of the model; a TorchScript function cannot be copied, and needs no copy."""
    verdict = run_audit(HoldsScripted(function), BATCH)
    assert not verdict.gaps, [outcome.gap for outcome in verdict.gaps]
    if marker is None:
        assert verdict.exit_code == 0
    else:
        assert verdict.errors and verdict.errors[0].lineno == line_of(marker), verdict.report()


class Slow(Probe):
    """Each training step takes a while: fit is a long stage, the other stages short ones."""

    def training_step(self, batch, batch_idx):
        threading.Event().wait(1.2)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "forked"])
def test_a_long_stage_is_said_to_be_running_and_a_short_one_is_not(monkeypatch, isolate):
    from lightning_kit.gpu_audit import isolation

    monkeypatch.setattr(isolation, "LONG_STAGE_S", 2.0)
    monkeypatch.setattr(isolation, "STILL_EVERY_S", 60.0)
    said: list[str] = []
    verdict = run_audit(Slow(), BATCH, isolate=isolate, say=said.append)
    assert verdict.exit_code == 0, verdict.report()
    # Each pass's fit (4 steps of 1.2 s; 2 as a rank of 2, which has half the data): said once, with the hook it
    # was in. (The other stages take a fraction of that: on a busy machine, perhaps more; not asserted here.)
    fits = [line for line in said if line.startswith("auditing fit ")]
    assert len(fits) == 3, said
    assert fits[0].startswith("auditing fit on simgpu:0, in ") and fits[0].endswith(" s so far"), said
    assert fits[1].startswith("auditing fit on simgpu:0 (DDP rank 0 of 2), in "), said
    assert fits[2].startswith("auditing fit on simgpu:1 (DDP rank 1 of 2), in "), said


def test_a_short_audit_says_nothing_of_its_progress():
    said: list[str] = []
    assert run_audit(Probe(), BATCH, say=said.append).exit_code == 0
    assert said == []


# Sparse tensors: COO and the compressed layouts, as buffers, plain attributes and made in a step.


class Sparse(Probe):
    def __init__(self, layout: str, held: str) -> None:
        super().__init__()
        adjacency = torch.eye(3)
        adjacency = {"coo": adjacency.to_sparse, "csr": adjacency.to_sparse_csr, "csc": adjacency.to_sparse_csc}[
            layout
        ]()
        self.held = held
        if held == "buffer":
            self.register_buffer("adjacency", adjacency)
        elif held == "attribute":
            self.adjacency = adjacency
        else:
            self.adjacencies = [adjacency]

    def forward(self, features):
        logits = self.net(features)
        if self.held == "made":
            indices = torch.tensor([[0, 1, 2], [0, 1, 2]])
            adjacency = torch.sparse_coo_tensor(indices, torch.ones(3), (3, 3))  # on the CPU
            return torch.sparse.mm(adjacency, logits.t()).t()  # sparse: product
        adjacency = self.adjacency if self.held != "list" else self.adjacencies[0]
        return (adjacency @ logits.t()).t()  # sparse: product


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_a_sparse_buffer_of_any_layout_passes_one_gpu_and_ddp_without_broadcast_buffers(layout):
    """DDP broadcasts the buffers of rank 0 as it wraps the model, and cannot broadcast a sparse one (nor can it on
    GPUs: the refusal is DistributedDataParallel's own); unless its strategy is told not to broadcast them."""
    verdict = run_audit(Sparse(layout, "buffer"), BATCH)
    assert [outcome.where for outcome in verdict.outcomes if outcome.error] == [
        "fit on simgpu:0 (DDP rank 0 of 2)",
        "fit on simgpu:1 (DDP rank 1 of 2)",
    ]
    assert (verdict.errors[0].kind, verdict.errors[0].operation) == ("DDP", "DistributedDataParallel")
    assert not verdict.gaps
    trainer = L.Trainer(strategy=DDPStrategy(broadcast_buffers=False), accelerator="cpu", devices=1)
    assert audit(Sparse(layout, "buffer"), BATCH, trainer=trainer).exit_code == 0


@pytest.mark.parametrize(
    "layout, held, marker",
    [
        ("coo", "attribute", "# sparse: product"),
        ("csr", "attribute", "# sparse: product"),
        ("csr", "list", "# sparse: product"),
        ("coo", "made", "# sparse: product"),
    ],
    ids=["coo-attribute", "csr-attribute", "csr-in-a-list", "coo-made-in-forward"],
)
def test_a_sparse_tensor_left_on_the_cpu_is_a_bug_naming_it(layout, held, marker):
    """Found like a dense one, at the line that uses it (where a GPU stops), never NotImplementedError."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(Sparse(layout, held), BATCH)
    found = str(caught.value)
    lines = [number for number, line in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in line]
    assert caught.value.lineno in lines and any(mixed in found for mixed in MIXED), found
    if held == "attribute":
        assert "It is `adjacency`, a plain tensor attribute" in found, found


class SparseEmbedding(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 8, sparse=True)

    def forward(self, features):
        return self.net(features + self.embedding(torch.arange(8, device=features.device) % 10).sum(0))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_an_embedding_with_sparse_gradients_passes():
    assert audit(SparseEmbedding(), BATCH).exit_code == 0


# The pytest plugin, named once more than its entry point names it.

ONE_TEST = "def test_one():\n    assert True\n"


@pytest.mark.parametrize("how", ["-p", "conftest", "both"])
def test_naming_the_pytest_plugin_again_runs_the_session(tmp_path, how):
    (tmp_path / "test_one.py").write_text(ONE_TEST)
    if how in ("conftest", "both"):
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["lightning_kit.pytest_plugin"]\n')
    named = ["-p", "lightning_kit.pytest_plugin"] if how in ("-p", "both") else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *named, "test_one.py"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
