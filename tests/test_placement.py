"""Mutation tests of the device audit, through a real generated project.

Each class of placement bug is written into a copy of a real generated project, as a
user's edit would put it there, and the audit of that project's configured model, data
and callbacks (what ``python -m <package>.placement`` audits: the project's ``ProjectCLI``
built from the same arguments) must stop at the line where a GPU would stop. Bugs in the
code every project shares, which lives in the library now, are planted in a copy of the
library put first on the path of a ``python -m <package>.placement`` process. The
unedited projects, and device-agnostic code of other shapes, pass.
"""

import importlib
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import lightning_kit
import pytest
import torch
import torch.nn.functional as F
import torchvision
from conftest import HANG_GUARD_S
from lightning_kit import DevicePlacementError, audit
from lightning_kit.building import build_all
from torch import nn

# Few data: the audit runs two short epochs whatever the data's size.
SMALL_DATA = {"image": ["--data.synthetic_size", "200"], "sequence": ["--data.num_sequences", "400"]}
_counter = itertools.count()


@pytest.fixture(scope="module")
def baked(cookies_session, template_dir) -> dict[str, Path]:
    """One image and one sequence project, baked once for the module."""
    roots = {}
    for task in ("image", "sequence"):
        result = cookies_session.bake(
            extra_context={"task": task, "project_name": f"audit {task}"}, template=str(template_dir)
        )
        assert result.exit_code == 0, result.exception
        roots[task] = Path(result.project_path)
    return roots


def project_copy(baked: dict[str, Path], task: str, edits: dict[str, list[tuple[str, str]]], tmp_path: Path):
    """Import a copy of the task's package, under a name of its own, with each (old, new) edit applied once."""
    name = f"mutant_{task}_{next(_counter)}"
    package = tmp_path / name
    shutil.copytree(baked[task] / "src" / f"audit_{task}", package)
    for relative, changes in edits.items():
        path = package / relative
        source = path.read_text()
        for old, new in changes:
            assert source.count(old) == 1, f"{old!r} should appear once in {relative}"
            source = source.replace(old, new)
        path.write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        return importlib.import_module(name), package


def audit_project(baked: dict[str, Path], task: str, package):
    """Audit what the project's command line configures: model, data module and the Trainer's callbacks.

    As ``python -m <package>.placement`` does: the library's command, with the project's ``ProjectCLI``.
    """
    cli = importlib.import_module(f"{package.__name__}.cli")
    placement = importlib.import_module(f"{package.__name__}.placement")
    assert placement.ProjectCLI is cli.ProjectCLI, "the project's command runs the library's with its own CLI"
    config = str(baked[task] / "configs" / "synthetic.yaml")
    arguments = ["--config", config, *SMALL_DATA[task], "--trainer.accelerator", "cpu", "--trainer.logger", "false"]
    model, datamodule, trainer = build_all(cli.ProjectCLI, arguments)
    return audit(model, datamodule, trainer=trainer)


def line_holding(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# (task, file, edits, the text on the line the audit must name, the kind of bug, and where it shows).
REFERENCE_CNN_MEAN = 'self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255)'
NORMALISE = "x = (images.float() - self.mean) / self.std"
POSITIONS = "self.position_embedding(self.positions[:T])"
METRICS = (
    '        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
    '        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
    '        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)\n'
)
PICK_METRIC = 'accuracy = getattr(self, f"{stage}_acc")'
KEEP_TRAIN_ACC = ("        self.train_acc.persistent(True)\n", "")  # no attribute once the metrics move
VAL_EPOCH_END = 'self._log_epoch("val")'
LOG_EPOCH = 'self.log(f"{stage}/{name}", metric.compute(), prog_bar=True, sync_dist=True)'
TASK_BUGS = {
    "tensor created in forward without a device": (
        "sequence",
        "models/attention.py",
        [(POSITIONS, "self.position_embedding(torch.arange(T))")],
        "torch.arange(T)",
        "mixed devices",
    ),
    "position indices kept as a plain attribute": (
        "sequence",
        "models/attention.py",
        [
            (
                'self.register_buffer("positions", torch.arange(max_len), persistent=False)',
                "self.positions = torch.arange(max_len)",
            )
        ],
        POSITIONS,
        "mixed devices",
    ),
    "normalisation constant kept as a plain attribute": (
        "image",
        "models/cnn.py",
        [(REFERENCE_CNN_MEAN, "self.mean = torch.tensor(mean).view(1, 3, 1, 1) * 255")],
        NORMALISE,
        "mixed devices",
    ),
    "a CPU generator for noise in forward": (
        "sequence",
        "models/attention.py",
        [
            (
                "x = self.norm(self.blocks(x))",
                "x = self.norm(self.blocks(x + torch.randn(x.shape, device=x.device, generator=torch.Generator())))",
            )
        ],
        "generator=torch.Generator()",
        "generator",
    ),
    "cuda:0 written into the network": (
        "image",
        "models/cnn.py",
        [(NORMALISE, 'x = (images.float().to("cuda:0") - self.mean) / self.std')],
        'to("cuda:0")',
        "another GPU",
    ),
    "a CPU tensor in the network's branch for CUDA": (
        "sequence",
        "models/attention.py",
        [(POSITIONS, "self.position_embedding(torch.arange(T) if tokens.is_cuda else self.positions[:T])")],
        "torch.arange(T) if tokens.is_cuda",
        "mixed devices",
    ),
    "GPU 0 assumed by the network": (
        "sequence",
        "models/attention.py",
        [(POSITIONS, "self.position_embedding(self.positions[:T].to(torch.device(tokens.device.type, 0)))")],
        "tokens.device.type, 0",
        "another GPU",
    ),
}


def audit_with_bug(baked, task, relative, edits, line_text, tmp_path):
    """Audit a copy of the project with ``edits`` to ``relative``: the error must name ``line_text``'s line there."""
    package, folder = project_copy(baked, task, {relative: edits}, tmp_path)
    with pytest.raises(DevicePlacementError) as caught:
        audit_project(baked, task, package)
    error, path = caught.value, folder / relative
    assert (Path(error.filename), error.lineno) == (path, line_holding(path, line_text)), error
    return error


@pytest.mark.parametrize("bug", TASK_BUGS)
def test_bugs_in_the_task_code_are_caught_at_their_line(baked, tmp_path, bug):
    task, relative, edits, line_text, kind = TASK_BUGS[bug]
    error = audit_with_bug(baked, task, relative, edits, line_text, tmp_path)
    assert error.kind == kind, error
    assert error.rank == (1 if kind == "another GPU" else 0), "code that assumes GPU 0 fails in the second process"


SHARED_BUGS = {
    "metrics kept in a plain dict": (
        "classifier.py",
        [
            (
                METRICS,
                '        self.accuracies = {s: MulticlassAccuracy(num_classes) for s in ("train", "val", "test")}\n',
            ),
            (PICK_METRIC, "accuracy = self.accuracies[stage]"),
            KEEP_TRAIN_ACC,
        ],
        "accuracy.update(logits, targets)",
        "mixed devices",
        "validation_step",
    ),
    "metrics kept in a plain list": (
        "classifier.py",
        [
            (METRICS, "        self.accuracies = [MulticlassAccuracy(num_classes) for _ in range(3)]\n"),
            (PICK_METRIC, 'accuracy = self.accuracies[("train", "val", "test").index(stage)]'),
            KEEP_TRAIN_ACC,
        ],
        "accuracy.update(logits, targets)",
        "mixed devices",
        "validation_step",
    ),
    "loss weight tensor held outside any module": (
        "classifier.py",
        [
            ("self.loss_fn = nn.CrossEntropyLoss()", "self.class_weights = torch.ones(num_classes)"),
            (
                "loss = self.loss_fn(logits, targets)",
                "loss = nn.functional.cross_entropy(logits, targets, weight=self.class_weights)",
            ),
        ],
        "weight=self.class_weights)",
        "mixed devices",
        "validation_step",
    ),
    ".cpu() inside a step": (
        "classifier.py",
        [("logits = self(inputs)\n", "logits = self(inputs).cpu()\n")],
        "loss = self.loss_fn(logits, targets)",
        "mixed devices",
        "validation_step",
    ),
    '.to("cpu") inside a step': (
        "classifier.py",
        [("logits = self(inputs)\n", 'logits = self(inputs).to("cpu")\n')],
        "loss = self.loss_fn(logits, targets)",
        "mixed devices",
        "validation_step",
    ),
    ".numpy() of a GPU tensor": (
        "classifier.py",
        [
            (
                'getattr(self, f"{stage}_loss").update(loss.detach())',
                'getattr(self, f"{stage}_loss").update(loss.detach().numpy())',
            )
        ],
        "loss.detach().numpy()",
        "numpy",
        "validation_step",
    ),
    "a CPU tensor added at the end of the validation epoch": (
        "classifier.py",
        [
            (
                VAL_EPOCH_END,
                f"{VAL_EPOCH_END}\n        self.last_val_total = next(self.parameters()).sum() + torch.zeros(1)",
            )
        ],
        "self.last_val_total = ",
        "mixed devices",
        "on_validation_epoch_end",
    ),
    "a CPU value logged with sync_dist=True": (
        "classifier.py",
        [(LOG_EPOCH, LOG_EPOCH.replace("metric.compute()", "metric.compute().cpu()"))],
        "metric.compute().cpu()",
        "sync_dist",
        "on_validation_epoch_end",
    ),
}


@pytest.mark.parametrize("task", ["image", "sequence"])
@pytest.mark.parametrize("bug", SHARED_BUGS)
def test_bugs_in_the_lightning_module_and_callbacks_are_caught_at_their_line(baked, tmp_path, bug, task):
    relative, edits, line_text, kind, step = SHARED_BUGS[bug]
    error = audit_with_bug(baked, task, relative, edits, line_text, tmp_path)
    assert (error.kind, error.step) == (kind, step), error
    under_ddp = " as DDP rank 0 of 2, " in str(error)
    assert error.rank == 0 and under_ddp == (kind == "sync_dist"), "sync_dist fails only under DDP"


@pytest.mark.parametrize("task", ["image", "sequence"])
def test_the_template_projects_pass_every_stage(baked, tmp_path, task):
    package, _ = project_copy(baked, task, {}, tmp_path)
    verdict = audit_project(baked, task, package)
    stages = [(outcome.stage, outcome.rank) for outcome in verdict.outcomes]
    assert stages == [(stage, rank) for rank in (0, 0, 1) for stage in ("fit", "validate", "test", "predict")]


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

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ResNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torchvision.models.resnet18(weights=None, num_classes=10)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self.net(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val/loss", F.cross_entropy(self.net(images), labels), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


def test_device_agnostic_modules_and_resnet18_pass():
    verdict = audit(DeviceAgnostic(), (torch.randn(4, 8), torch.randint(0, 3, (4,))))
    assert {outcome.stage for outcome in verdict.outcomes} == {"fit"}
    verdict = audit(ResNet(), (torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))))
    assert {outcome.stage for outcome in verdict.outcomes} == {"fit", "validate"}


# The run's status record, written after fit; its first line is where the planted one goes.
ON_FIT_END = "    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:\n"
# Bugs in the code every project shares, the library's: (task, the library's file, edits, the text on the
# line the audit must name (in that file, or (another of its files, its text)), what CUDA says, and where it
# fails: (stage, rank, step)).
LIBRARY_BUGS = {
    "a CPU generator for on-device augmentation": (
        "image",
        "data/image_splits.py",
        [("generator = torch.Generator(device=images.device)", "generator = torch.Generator()")],
        ("data/augment.py", "top = torch.randint("),  # made by the data module, used by the augmentation
        "Expected a 'cuda' device type for generator but found 'cpu'",
        ("fit", 0, "on_after_batch_transfer"),
    ),
    "GPU 0 assumed by the augmentation": (
        "image",
        "data/augment.py",
        [
            (
                "rows = torch.arange(H, device=images.device)",
                "rows = torch.arange(H, device=torch.device(images.device.type, 0))",
            )
        ],
        "rows = torch.arange(H",
        "asked for cuda:0 in the process whose GPU is cuda:1",
        ("fit", 1, "on_after_batch_transfer"),
    ),
    "a CPU tensor in a callback after fit": (
        "sequence",
        "callbacks/status.py",
        [
            ("import contextlib\n", "import contextlib\n\nimport torch\n"),  # the planted line's torch.eye
            (
                ON_FIT_END,
                f"{ON_FIT_END}        torch.ones(2, device=trainer.strategy.root_device) + torch.eye(2)\n",
            ),
        ],
        "torch.ones(2, device=trainer.strategy.root_device) + torch.eye(",
        "Expected all tensors to be on the same device",
        ("fit", 0, "on_fit_end"),
    ),
}
# The first bug's line in the audit's report: FAILED fit on simgpu:0, Classifier.training_step: aten.add.Tensor at f:12
FAILED = re.compile(r"^FAILED (\w+) on simgpu:(\d)[^,]*, (.+?): \S+ at (.+):(\d+)$", flags=re.MULTILINE)


def library_copy(relative: str, edits: list[tuple[str, str]], folder: Path) -> Path:
    """A copy of the library's package in ``folder`` with each (old, new) edit applied once to ``relative``."""
    package = shutil.copytree(Path(lightning_kit.__file__).parent, folder / "lightning_kit")
    path = package / relative
    source = path.read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} should appear once in {relative}"
        source = source.replace(old, new)
    path.write_text(source)
    return package


@pytest.mark.parametrize("bug", LIBRARY_BUGS)
def test_bugs_in_the_librarys_code_are_caught_at_their_line_by_the_projects_command(baked, tmp_path, bug):
    """`python -m <package>.placement` of a project, with the library's code edited: the report names the line."""
    task, relative, edits, line_text, says, (stage, rank, step) = LIBRARY_BUGS[bug]
    package = library_copy(relative, edits, tmp_path / "library")
    root = baked[task]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "library"), str(root / "src")])}
    command = [sys.executable, "-m", f"audit_{task}.placement", "--config", "configs/synthetic.yaml"]
    command += [*SMALL_DATA[task], "--trainer.logger", "false"]
    done = subprocess.run(
        command, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    if isinstance(line_text, tuple):
        relative, line_text = line_text
    path = package / relative
    first = FAILED.search(done.stdout)
    assert first is not None, done.stdout[-4000:]
    assert (first.group(1), int(first.group(2)), first.group(3).rpartition(".")[2]) == (stage, rank, step), first[0]
    assert (Path(first.group(4)), int(first.group(5))) == (path, line_holding(path, line_text)), first[0]
    report = done.stdout[first.end() :]
    assert says in report.split("\nFAILED ")[0], report[:3000]
