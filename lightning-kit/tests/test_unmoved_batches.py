"""A batch that Lightning cannot move to the GPU: the audit names its type, where the CPU tensor sits, and the fixes.

Lightning moves a batch's tensors, those in lists, tuples, dicts, namedtuples and dataclasses, and
objects with a ``.to(device)`` method; anything else it hands on as it is, its tensors on the CPU,
and the first operation that meets one with the model's weights fails on a GPU, at its line. The
audit stops at that line too, and names the cause: the batch's type and the tensor's place in it.
Batches Lightning moves pass, and so do CPU tensors a step keeps on the CPU: a batch that holds one
is no bug until an operation on the GPU meets it.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from test_simulated_gpu import line_of
from torch import nn
from torch.utils.data import DataLoader

from lightning_kit.gpu_audit import EXIT_PASSED, DevicePlacementError, audit

X, Y = torch.randn(4, 8), torch.randint(0, 3, (4,))
LIGHTNING_MOVES = (
    "Lightning moves only tensors in lists, tuples, dicts, namedtuples and dataclasses, and objects with a "
    ".to(device) method"
)
TRANSFER_HOOK = "override the LightningModule's transfer_batch_to_device(self, batch, device, dataloader_idx) hook"


class OneBatch(L.LightningDataModule):
    """Training data: ``batch``, twice, as it is (no collation)."""

    def __init__(self, batch) -> None:
        super().__init__()
        self.batch = batch

    def train_dataloader(self):
        return DataLoader([self.batch, self.batch], batch_size=None, collate_fn=_as_is)


def _as_is(batch):
    return batch


class Reads(L.LightningModule):
    """Trains ``net`` on the features and labels that ``unpack`` reads from the batch (``batch.x``, ``batch.y``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        features, labels = self.unpack(batch)
        return F.cross_entropy(self.net(features), labels)  # meets the weights

    def unpack(self, batch):
        return batch.x, batch.y

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ReadsByKey(Reads):
    def unpack(self, batch):
        return batch["x"], batch["y"]


class ReadsExtra(Reads):
    def unpack(self, batch):
        return batch["extra"].values, batch["y"]


# Batches Lightning cannot move: none of the types it looks into, and no .to().


class PlainBatch:
    def __init__(self, x, y) -> None:
        self.x, self.y = x, y


class SlotsBatch:
    __slots__ = ("x", "y")

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y


class SelfReferring(PlainBatch):
    def __init__(self, x, y) -> None:
        super().__init__(x, y)
        self.itself = self  # a circle: the audit's walk of the batch ends


class Features:
    """Read like a dict (``batch["x"]``), but no ``Mapping``: Lightning does not look inside."""

    def __init__(self, **values) -> None:
        self._values = values

    def __getitem__(self, key):
        return self._values[key]


class Extra:
    def __init__(self, values) -> None:
        self.values = values


UNMOVABLE = {
    "a plain class": (Reads, PlainBatch(X, Y), "batch.x", "PlainBatch"),
    "a class with __slots__": (Reads, SlotsBatch(X, Y), "batch.x", "SlotsBatch"),
    "a class that refers to itself": (Reads, SelfReferring(X, Y), "batch.x", "SelfReferring"),
    "a dict-like class that is no Mapping": (ReadsByKey, Features(x=X, y=Y), "batch._values['x']", "Features"),
    "a plain object in a dict": (ReadsExtra, {"extra": Extra(X), "y": Y}, "batch['extra'].values", "Extra"),
}


@pytest.mark.parametrize(("model", "batch", "path", "holder"), UNMOVABLE.values(), ids=UNMOVABLE.keys())
def test_a_batch_lightning_cannot_move_is_named_with_the_tensors_place_and_both_fixes(model, batch, path, holder):
    """The audit stops where a GPU would, and says why: the type Lightning cannot move, with its module, the
    CPU tensor's place in the batch, what Lightning moves, and the two fixes (a to() method, or the hook)."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(model(), OneBatch(batch))
    error, message = caught.value, str(caught.value)
    assert (error.kind, error.hook) == ("unmoved batch", f"{model.__name__}.training_step"), message
    assert (error.filename, error.lineno) == (__file__, line_of("# meets the weights", __file__)), message
    assert "On a GPU: RuntimeError: Expected all tensors to be on the same device" in message
    qualified = f"{__name__}.{holder}"
    assert f"The tensor on cpu is `{path}`, (4, 8) torch.float32, which Lightning left on the CPU" in message
    assert f"{qualified}, which Lightning cannot move. {LIGHTNING_MOVES}" in message
    fix = message.splitlines()[-1]
    assert fix.startswith(f"Fix: give {qualified} a to(self, device) method that returns it with its tensors moved")
    assert "(or make it a dataclass or a NamedTuple)" in fix and TRANSFER_HOOK in fix


# Batches Lightning moves, but not wholly: a to() that forgets a tensor, a dataclass attribute that is no
# __init__ field, a transfer_batch_to_device of the user's that forgets one.


class ForgetfulTo:
    def __init__(self, y, x) -> None:
        self.y, self.x = y, x

    def to(self, device):
        return ForgetfulTo(self.y.to(device), self.x)  # x stays


@dataclass
class Derived:
    y: torch.Tensor
    x: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.x = X


class MovesLabelsOnly(Reads):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return PlainBatch(batch.x, batch.y.to(device))


PARTLY_MOVED = {
    "a to() that forgets a tensor": (
        Reads,
        ForgetfulTo(Y, X),
        "Lightning moved the batch, a test_unmoved_batches.ForgetfulTo, by calling its to() method, which does not "
        "move this tensor",
        "make test_unmoved_batches.ForgetfulTo.to(device) move every tensor it holds",
    ),
    "a dataclass attribute that is no __init__ field": (
        Reads,
        Derived(Y),
        "not a field that its __init__ takes, and Lightning moves only those of a dataclass",
        "make it a field of test_unmoved_batches.Derived that __init__ takes",
    ),
    "the user's transfer_batch_to_device": (
        MovesLabelsOnly,
        PlainBatch(X, Y),
        "which MovesLabelsOnly.transfer_batch_to_device left on the CPU",
        "move `batch.x` in MovesLabelsOnly.transfer_batch_to_device too (batch.x.to(device))",
    ),
}


@pytest.mark.parametrize(("model", "batch", "cause", "fix"), PARTLY_MOVED.values(), ids=PARTLY_MOVED.keys())
def test_a_tensor_that_a_move_of_the_batch_forgets_is_named_with_what_moved_the_rest(model, batch, cause, fix):
    with pytest.raises(DevicePlacementError) as caught:
        audit(model(), OneBatch(batch))
    message = str(caught.value)
    assert caught.value.kind == "unmoved batch" and caught.value.lineno == line_of("# meets the weights", __file__)
    assert "The tensor on cpu is `batch.x`, (4, 8) torch.float32, which" in message and cause in message
    assert message.splitlines()[-1].startswith(f"Fix: {fix}"), message


class ScalesOnTheCPU(Reads):
    def unpack(self, batch):
        return batch.x * 2, batch.y  # computed on the CPU from the batch's CPU tensor


def test_a_tensor_computed_from_an_unmoved_batch_is_mixed_devices_with_the_batch_named_as_a_likely_source():
    """The tensor that meets the weights is not the batch's own, but made from it: the audit says what it knows."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(ScalesOnTheCPU(), OneBatch(PlainBatch(X, Y)))
    message = str(caught.value)
    assert caught.value.kind == "mixed devices", message
    assert (
        "The batch holds tensors that Lightning left on the CPU, `batch.x`, `batch.y`, in a "
        "test_unmoved_batches.PlainBatch; if this one comes from them: give test_unmoved_batches.PlainBatch a "
        "to(self, device) method"
    ) in message


# Batches Lightning moves, whole.


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclass
class Fields:
    x: torch.Tensor
    note: str = "a string field"


class Graph:
    """As torch_geometric's ``Data``: tensors and other values as attributes, all tensors moved by its to()."""

    def __init__(self, **attributes) -> None:
        self.__dict__.update(attributes)

    def to(self, device, **kwargs):
        moved = {k: v.to(device, **kwargs) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return Graph(**moved)


class ReadOnly(Mapping):
    """A Mapping that is no dict: Lightning moves its values, and builds it again from a dict."""

    def __init__(self, values) -> None:
        self._values = dict(values)

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)


class Meta:
    """A plain object whose tensors stay on the CPU, where the step uses them: no bug."""

    def __init__(self) -> None:
        self.ids = torch.arange(4)
        self.scale = torch.tensor(2.0)  # 0-dim: CUDA takes a CPU scalar in element-wise operations


MOVABLE = {
    "list": [X, [Y]],
    "tuple": (X,),
    "pair": Pair(X, Y),
    "fields": Fields(X),
    "graph": Graph(x=X, y=Y, name="a graph", num_nodes=4),
    "mapping": ReadOnly({"x": X}),
    "name": "batch 0",
    "size": 4,
    "nothing": None,
    "meta": Meta(),
}


class ReadsEverything(Reads):
    def training_step(self, batch, batch_idx):
        features = [batch["list"][0], batch["tuple"][0], batch["pair"].x, batch["fields"].x, batch["graph"].x]
        logits = sum(self.net(x) for x in [*features, batch["mapping"]["x"]]) * batch["meta"].scale
        assert batch["meta"].ids.device.type == "cpu" and int(batch["meta"].ids.sum()) == 6
        labels = (batch["list"][1][0], batch["pair"].y, batch["graph"].y)
        return sum(F.cross_entropy(logits, y) for y in labels)


def test_batches_lightning_moves_and_cpu_tensors_kept_on_the_cpu_pass():
    """Lists, tuples, namedtuples, dataclasses, a Data-like object with to(), a Mapping that is no dict, nested,
    with strings, numbers and None beside them; and a plain object whose tensors the step uses on the CPU only."""
    verdict = audit(ReadsEverything(), OneBatch(MOVABLE))
    assert verdict.exit_code == EXIT_PASSED and not verdict.errors and not verdict.gaps
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} == {("fit", 0), ("fit", 1)}


class AddsAHostOffset(Reads):
    def training_step(self, batch, batch_idx):
        logits = self.net(batch["pair"].x) + torch.ones(4, 3)  # a tensor of the step's own, on the CPU
        return F.cross_entropy(logits, batch["graph"].y)


def test_a_bug_of_the_step_given_a_batch_lightning_moves_does_not_blame_the_batch():
    """Nothing of a batch Lightning moves is taken for left on the CPU: the error is the step's own."""
    moved = {name: value for name, value in MOVABLE.items() if name != "meta"}
    with pytest.raises(DevicePlacementError) as caught:
        audit(AddsAHostOffset(), OneBatch(moved))
    message = str(caught.value)
    assert caught.value.kind == "mixed devices" and caught.value.lineno == line_of(
        "# a tensor of the step's own", __file__
    )
    assert "The tensor on cpu is the argument `other`, (4, 3) torch.float32." in message
    assert "Lightning left" not in message and "batch" not in message.split("\n", 2)[2], message


def _collate_onto_the_gpu(pairs):
    features, labels = torch.utils.data.default_collate(pairs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return features.to(device), labels.to(device)  # in a worker: CUDA cannot start in a forked process


class CollatesOntoTheGPUInWorkers(L.LightningModule):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.net, self.workers = nn.Linear(8, 3), workers

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self.net(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        pairs = list(zip(torch.randn(16, 8), torch.randint(0, 3, (16,)), strict=True))
        return DataLoader(pairs, batch_size=8, num_workers=self.workers, collate_fn=_collate_onto_the_gpu)


def test_a_worker_that_puts_a_batch_on_the_gpu_is_found_at_its_line():
    """A DataLoader's workers are forked from a process that uses CUDA: CUDA refuses to start in them."""
    with pytest.raises(DevicePlacementError) as caught:
        audit(CollatesOntoTheGPUInWorkers(workers=1))
    assert caught.value.kind == "CUDA in a worker" and caught.value.lineno == line_of("# in a worker: CUDA", __file__)
    assert "Cannot re-initialize CUDA in forked subprocess" in str(caught.value)
    audit(CollatesOntoTheGPUInWorkers(workers=0))  # in the main process it makes the batch on the GPU: no error
