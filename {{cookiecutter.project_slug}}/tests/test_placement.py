"""The placement rules of docs/device-placement.md, each checked on a simulated GPU.

The audit runs a model's steps on a simulated CUDA device (no GPU needed) and
fails exactly where a real GPU would. Each rule below has a test that shows the
wrong way failing and the right way passing.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from {{ cookiecutter.project_slug }} import placement
from {{ cookiecutter.project_slug }}.cli import build
from {{ cookiecutter.project_slug }}.placement import DevicePlacementError, audit

PROJECT = Path(__file__).resolve().parents[1]
BATCH = (torch.randn(4, 8), torch.randint(0, 3, (4,)))


class Probe(L.LightningModule):
    """The smallest LightningModule: ``net`` maps (B, 8) features to (B, 3) logits."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self.net(features), labels)


def line_of(text: str) -> int:
    """The line of this file that holds ``text``."""
    return next(number for number, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


# Rule 1: Lightning places the model (parameters and buffers) and the batch.


def test_shipped_model_and_data_pass_the_audit(in_tmp_path, synthetic_config):
    """The project's own model, on a real batch from its own data module, runs every step on a GPU."""
    model, datamodule = build(["--config", synthetic_config])
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    steps = audit(model, batch, datamodule=datamodule)
    assert set(steps) == {"training_step", "validation_step", "test_step", "predict_step"}


def test_parameters_buffers_and_batches_need_no_placing():
    audit(Probe(nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 3))), BATCH)


# Rule 2: a tensor created inside forward takes the device of the input.


class PositionsWithoutDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1]))  # created on the CPU


class PositionsOnInputDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        return self.linear(x + torch.arange(x.shape[1], device=x.device) + x.new_ones(x.shape[1]))


def test_tensors_created_in_forward_take_the_input_device():
    with pytest.raises(DevicePlacementError) as caught:
        audit(Probe(PositionsWithoutDevice()), BATCH)
    assert caught.value.lineno == line_of("# created on the CPU")
    assert caught.value.filename == __file__ and caught.value.step == "training_step"
    audit(Probe(PositionsOnInputDevice()), BATCH)


# Rule 3: constants are buffers, made once in __init__.


class ConstantAsAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.scale = torch.linspace(0.5, 1.5, 8)

    def forward(self, x):
        return self.linear(x * self.scale)  # a plain attribute stays on the CPU


class ConstantAsBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8), persistent=False)

    def forward(self, x):
        return self.linear(x * self.scale)


def test_constants_are_buffers():
    with pytest.raises(DevicePlacementError) as caught:
        audit(Probe(ConstantAsAttribute()), BATCH)
    assert caught.value.lineno == line_of("# a plain attribute stays on the CPU")
    audit(Probe(ConstantAsBuffer()), BATCH)


# Rule 4: a loss holds no tensors, unless it has weights: then it is a submodule.


class WeightedLoss(Probe):
    def __init__(self, as_module: bool) -> None:
        super().__init__(nn.Linear(8, 3))
        weight = torch.tensor([1.0, 2.0, 3.0])
        self.as_module = as_module
        self.loss_fn = nn.CrossEntropyLoss(weight=weight)  # the weight is a buffer of the loss
        self.weight = weight

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self.net(features)
        if self.as_module:
            return self.loss_fn(logits, labels)
        return F.cross_entropy(logits, labels, weight=self.weight)  # a bare weight tensor


def test_loss_weights_live_in_a_loss_module():
    with pytest.raises(DevicePlacementError) as caught:
        audit(WeightedLoss(as_module=False), BATCH)
    assert caught.value.lineno == line_of("# a bare weight tensor")
    audit(WeightedLoss(as_module=True), BATCH)


# Rule 5: metrics are torchmetrics attributes, or in a ModuleDict: never a plain dict or list.


class MetricsIn(Probe):
    def __init__(self, container: str) -> None:
        super().__init__(nn.Linear(8, 3))
        metrics = {"val_acc": MulticlassAccuracy(3)}
        self.metrics = nn.ModuleDict(metrics) if container == "ModuleDict" else metrics

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.metrics["val_acc"].update(self.net(features), labels)  # update the metric


def test_metrics_are_attributes_or_in_a_module_dict():
    with pytest.raises(DevicePlacementError) as caught:
        audit(MetricsIn("dict"), BATCH)
    assert caught.value.lineno == line_of("# update the metric") and caught.value.step == "validation_step"
    audit(MetricsIn("ModuleDict"), BATCH)


# Rule 6: no .cpu() or .to("cpu") inside a step.


class MovesToCPU(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        predictions = self.net(features).argmax(dim=1).cpu()
        return (predictions == labels).float().mean()  # compares CPU with GPU


def test_moving_to_the_cpu_inside_a_step_is_caught():
    with pytest.raises(DevicePlacementError) as caught:
        audit(MovesToCPU(nn.Linear(8, 3)), BATCH)
    assert caught.value.lineno == line_of("# compares CPU with GPU")


# Rule 7: 0-dim CPU tensors may meet GPU tensors, as on a real GPU.


class ScalesByCPUScalar(Probe):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * torch.tensor(0.5)


def test_zero_dim_cpu_scalars_are_allowed():
    audit(ScalesByCPUScalar(nn.Linear(8, 3)), BATCH)


# Rule 8: a batch type Lightning does not know moves through transfer_batch_to_device.


@dataclass
class Pair:
    features: torch.Tensor
    labels: torch.Tensor


class PairProbe(Probe):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch.features), batch.labels)  # a Pair batch


class PairProbeWithTransfer(PairProbe):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return Pair(batch.features.to(device), batch.labels.to(device))


def test_custom_batch_types_move_through_transfer_batch_to_device():
    class Opaque:  # neither a tensor, a collection nor a dataclass: Lightning cannot see inside
        def __init__(self, features, labels):
            self.features, self.labels = features, labels

    with pytest.raises(DevicePlacementError):
        audit(PairProbe(nn.Linear(8, 3)), Opaque(*BATCH))
    audit(PairProbe(nn.Linear(8, 3)), Pair(*BATCH))  # dataclasses are moved field by field
    audit(PairProbeWithTransfer(nn.Linear(8, 3)), Opaque(*BATCH))


# The audit itself.


def test_audit_leaves_the_model_and_global_state_as_it_found_them():
    model = Probe(nn.Linear(8, 3))
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng, deterministic = torch.get_rng_state(), torch.are_deterministic_algorithms_enabled()
    audit(model, BATCH)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert model.device == torch.device("cpu") and model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.get_default_device() == torch.device("cpu")


def test_the_command_line_audit_reports_every_step(in_tmp_path, synthetic_config, capsys):
    placement.main(["--config", synthetic_config])
    out = capsys.readouterr().out
    for step in ("training_step", "validation_step", "test_step", "predict_step"):
        assert f"{step:<16} ok" in out
    assert "will run on a GPU" in out


# No manual placement anywhere in the project.


def manual_placements(source: str) -> list[int]:
    """Lines that place tensors by hand: .cuda(), .cpu(), .to(<device>) or torch.device("cuda...")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, args = node.func.attr, [*node.args, *(keyword.value for keyword in node.keywords)]
        mentions_device = any(
            "device" in ast.unparse(arg).lower() or "cuda" in ast.unparse(arg) or "'cpu'" in ast.unparse(arg)
            for arg in args
        ) or any(keyword.arg == "device" for keyword in node.keywords)
        if (
            name in ("cuda", "cpu")
            or (name == "to" and mentions_device)
            or (name == "device" and ast.unparse(node.func.value) == "torch" and "cuda" in ast.unparse(node))
        ):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize(
    "source",
    [
        "model.cuda()",
        "x = batch.cpu()",
        "x = x.to(device)",
        "x = x.to(self.device)",
        "x = x.to('cpu')",
        "x = x.to(device='cuda:0')",
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    ],
)
def test_the_placement_check_finds_manual_placement(source):
    assert manual_placements(source) == [1]


@pytest.mark.parametrize(
    "source",
    [
        "x = torch.arange(n, device=x.device)",
        "x = x.new_zeros(3)",
        "x = x.to(torch.float16)",
        "self.register_buffer('positions', torch.arange(8))",
        "ok = torch.cuda.is_available()",
    ],
)
def test_the_placement_check_allows_device_agnostic_code(source):
    assert manual_placements(source) == []


def test_project_code_places_no_tensors_by_hand():
    """Lightning places everything; see docs/device-placement.md.

    Two modules stand in for Lightning and are exempt: the audit, which moves a
    model to a simulated GPU, and the benchmark's hand-written loop.
    """
    files = [path for path in (PROJECT / "src").rglob("*.py") if path.name not in ("placement.py", "bench.py")]
    files.append(PROJECT / "train.py")
    offenders = [
        f"{path.relative_to(PROJECT)}:{line}"
        for path in files
        for line in manual_placements(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"manual placement at {offenders}: docs/device-placement.md says what to do instead"
