"""Mutation tests of the generated device audit.

Each placement bug the audit must catch is applied to a copy of a real generated
module; the audit must raise DevicePlacementError at the line where a GPU would
fail. The clean modules, and device-agnostic code of other shapes, must pass.
"""

import importlib
import importlib.util
import itertools
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

_counter = itertools.count()


@pytest.fixture(scope="module")
def project(cookies_session, template_dir):
    """One image and one sequence project, importable as `audit_image` and `audit_sequence`."""
    roots = {}
    for task in ("image", "sequence"):
        result = cookies_session.bake(
            extra_context={"task": task, "project_name": f"audit {task}"}, template=str(template_dir)
        )
        assert result.exit_code == 0, result.exception
        roots[task] = Path(result.project_path)
    with pytest.MonkeyPatch.context() as patch:
        for root in roots.values():
            patch.syspath_prepend(str(root / "src"))
        yield {task: importlib.import_module(f"audit_{task}") for task in roots} | {"roots": roots}


def mutant(project, task: str, module: str, edits: list[tuple[str, str]], tmp_path: Path):
    """Import a copy of the project's `module` with each (old, new) edit applied exactly once."""
    source_path = project["roots"][task] / "src" / f"audit_{task}" / Path(*module.split("."))
    source = source_path.with_suffix(".py").read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} should appear once in {module}"
        source = source.replace(old, new)
    path = tmp_path / f"mutant_{next(_counter)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded, path


def line_holding(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def real_batch(project, task: str):
    """A training batch from the project's own data module, as its DataLoader yields it."""
    if task == "image":
        datamodule = importlib.import_module("audit_image.data.images").ImageDataModule(
            dataset="synthetic", synthetic_size=120, batch_size=8
        )
    else:
        datamodule = importlib.import_module("audit_sequence.data.sequences").SequenceDataModule(
            num_sequences=200, batch_size=8
        )
    datamodule.setup("fit")
    return next(iter(datamodule.train_dataloader())), datamodule


def classifier_with(project, task: str, net: nn.Module | None = None, classifier_module=None):
    classifier_module = classifier_module or importlib.import_module(f"audit_{task}.classifier")
    if net is None:
        net = (
            importlib.import_module("audit_image.models.cnn").ReferenceCNN()
            if task == "image"
            else importlib.import_module("audit_sequence.models.attention").AttentionClassifier()
        )
    return classifier_module.Classifier(net, num_classes=10 if task == "image" else 2)


def assert_caught(project, task, model, path: Path, line_text: str, step: str = "training_step"):
    error_type = importlib.import_module(f"audit_{task}.placement").DevicePlacementError
    audit = importlib.import_module(f"audit_{task}.placement").audit
    batch, datamodule = real_batch(project, task)
    with pytest.raises(error_type) as caught:
        audit(model, batch, datamodule=datamodule)
    assert (caught.value.filename, caught.value.lineno) == (str(path), line_holding(path, line_text)), caught.value
    assert caught.value.step == step
    assert "Expected all tensors to be on the same device" in str(caught.value) or "different devices" in str(
        caught.value
    )


NET_BUGS = {
    "tensor created in forward without a device": (
        "sequence",
        "models.attention",
        [("self.position_embedding(self.positions[:T])", "self.position_embedding(torch.arange(T))")],
        "torch.arange(T)",
        "AttentionClassifier",
    ),
    "position indices kept as a plain attribute": (
        "sequence",
        "models.attention",
        [
            (
                'self.register_buffer("positions", torch.arange(max_len), persistent=False)',
                "self.positions = torch.arange(max_len)",
            )
        ],
        "self.position_embedding(self.positions[:T])",
        "AttentionClassifier",
    ),
    "normalisation constant kept as a plain attribute": (
        "image",
        "models.cnn",
        [
            (
                'self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255, persistent=False)',
                "self.mean = torch.tensor(mean).view(1, 3, 1, 1) * 255",
            )
        ],
        "x = (images.float() - self.mean) / self.std",
        "ReferenceCNN",
    ),
}


@pytest.mark.parametrize("bug", NET_BUGS)
def test_network_bugs_are_caught_at_their_line(project, tmp_path, bug):
    task, module, edits, line_text, net_class = NET_BUGS[bug]
    mutated, path = mutant(project, task, module, edits, tmp_path)
    model = classifier_with(project, task, net=getattr(mutated, net_class)())
    assert_caught(project, task, model, path, line_text)


METRICS = (
    '        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
    '        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
    '        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
)
PICK_METRIC = 'accuracy = getattr(self, f"{stage}_acc")'
CLASSIFIER_BUGS = {
    "metrics kept in a plain dict": (
        [
            (
                METRICS,
                '        self.accuracies = {s: MulticlassAccuracy(num_classes) for s in ("train", "val", "test")}\n',
            ),
            (PICK_METRIC, "accuracy = self.accuracies[stage]"),
        ],
        "accuracy.update(logits, targets)",
    ),
    "metrics kept in a plain list": (
        [
            (METRICS, "        self.accuracies = [MulticlassAccuracy(num_classes) for _ in range(3)]\n"),
            (PICK_METRIC, 'accuracy = self.accuracies[("train", "val", "test").index(stage)]'),
        ],
        "accuracy.update(logits, targets)",
    ),
    "loss weight tensor held outside any module": (
        [
            ("self.loss_fn = nn.CrossEntropyLoss()", "self.class_weights = torch.ones(num_classes)"),
            (
                "loss = self.loss_fn(logits, targets)",
                "loss = nn.functional.cross_entropy(logits, targets, weight=self.class_weights)",
            ),
        ],
        "weight=self.class_weights)",
    ),
    ".cpu() inside a step": (
        [("logits = self(inputs)\n", "logits = self(inputs).cpu()\n")],
        "loss = self.loss_fn(logits, targets)",
    ),
    '.to("cpu") inside a step': (
        [("logits = self(inputs)\n", 'logits = self(inputs).to("cpu")\n')],
        "loss = self.loss_fn(logits, targets)",
    ),
}


@pytest.mark.parametrize("task", ["image", "sequence"])
@pytest.mark.parametrize("bug", CLASSIFIER_BUGS)
def test_lightning_module_bugs_are_caught_at_their_line(project, tmp_path, bug, task):
    edits, line_text = CLASSIFIER_BUGS[bug]
    mutated, path = mutant(project, task, "classifier", edits, tmp_path)
    assert_caught(project, task, classifier_with(project, task, classifier_module=mutated), path, line_text)


@pytest.mark.parametrize("task", ["image", "sequence"])
def test_the_template_models_pass_on_real_batches(project, task):
    audit = importlib.import_module(f"audit_{task}.placement").audit
    batch, datamodule = real_batch(project, task)
    steps = audit(classifier_with(project, task), batch, datamodule=datamodule)
    assert set(steps) == {"training_step", "validation_step", "test_step", "predict_step"}


class DeviceAgnostic(L.LightningModule):
    """New tensors from the input's device, a CPU scalar, and a weighted loss as a submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0]))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x + torch.arange(x.shape[1], device=x.device) + x.new_ones(x.shape[1]) + x.new_tensor(0.5)
        return self.loss_fn(self.linear(x), y) * torch.tensor(0.5)


class ResNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torchvision.models.resnet18(weights=None, num_classes=10)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self.net(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val/loss", F.cross_entropy(self.net(images), labels))


def test_device_agnostic_modules_and_resnet18_pass(project):
    audit = importlib.import_module("audit_image.placement").audit
    assert set(audit(DeviceAgnostic(), (torch.randn(4, 8), torch.randint(0, 3, (4,))))) == {"training_step"}
    resnet_batch = (torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,)))
    assert set(audit(ResNet(), resnet_batch)) == {"training_step", "validation_step"}
