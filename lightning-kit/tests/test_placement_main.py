"""The audit's command: the audit of what ``train.py`` builds from the same arguments; its exit status.

A project's ``python -m <package>.placement`` runs ``lightning_kit.gpu_audit.main`` with the
project's command line (``ProjectCLI``); ``python -m lightning_kit.placement`` runs it with
``GenericCLI``, which takes any ``--model`` and ``--data`` by class path.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, IMAGE_PROJECT, PROJECT, SEQUENCE_PROJECT
from image_project.cli import ProjectCLI as ImageCLI
from sequence_project.cli import ProjectCLI as SequenceCLI
from test_simulated_gpu import line_of
from torch import nn

from lightning_kit import placement as command
from lightning_kit.gpu_audit.verdict import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE

# Each task's project, its command line and its offline configuration.
PROJECTS = {"image": (IMAGE_PROJECT, ImageCLI), "sequence": (SEQUENCE_PROJECT, SequenceCLI)}
# The image project's classes, named for GenericCLI: what its ProjectCLI builds by default.
GENERIC_IMAGE = [
    *("--model", "image_project.classifier.Classifier", "--model.num_classes", "10"),
    *("--model.net", "image_project.models.cnn.ReferenceCNN", "--model.net.num_classes", "10"),
    *("--data", "image_project.data.images.ImageDataModule", "--data.dataset", "synthetic"),
]


def main(args: list[str], cli_class=ImageCLI) -> None:
    """The image project's ``python -m image_project.placement args``, in this process."""
    command.main(args, cli_class=cli_class)


def run_module(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m module args`` in its own process, in ``cwd``, with the baked projects importable."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def assert_every_stage(out: str) -> None:
    for stage in ("fit", "validate", "test", "predict"):
        assert f"{stage} on simgpu:0 " in out and f"{stage} on simgpu:1 (DDP rank 1 of 2)" in out
    assert "the model will run on a GPU" in out


@pytest.mark.parametrize("task", PROJECTS)
def test_the_command_line_audit_reports_every_stage(in_tmp_path, task, capsys):
    """Each task's project: images, and token sequences (integer inputs, an attention network)."""
    project, cli_class = PROJECTS[task]
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(project / "configs" / "synthetic.yaml")], cli_class)
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_PASSED, out
    assert_every_stage(out)
    assert not list(in_tmp_path.iterdir()), "the audit writes nothing where it runs"


@pytest.mark.slow
def test_a_projects_placement_module_runs_the_audit_with_its_command_line(in_tmp_path, synthetic_config):
    """``python -m image_project.placement``: the project's thin command, with its ProjectCLI's defaults."""
    audited = run_module("image_project.placement", "--config", synthetic_config, cwd=in_tmp_path)
    assert audited.returncode == EXIT_PASSED, audited.stdout + audited.stderr
    assert "Auditing Classifier (ReferenceCNN) with ImageDataModule on a simulated GPU" in audited.stdout
    assert_every_stage(audited.stdout)
    assert not list(in_tmp_path.iterdir()), "the audit writes nothing where it runs"


@pytest.mark.slow
def test_the_librarys_placement_module_audits_any_classes_named(in_tmp_path):
    """``python -m lightning_kit.placement --model ... --data ...`` (GenericCLI); a mistake names that command."""
    audited = run_module("lightning_kit.placement", *GENERIC_IMAGE, cwd=in_tmp_path)
    assert audited.returncode == EXIT_PASSED, audited.stdout + audited.stderr
    assert "Auditing Classifier (ReferenceCNN) with ImageDataModule on a simulated GPU" in audited.stdout
    assert_every_stage(audited.stdout)
    assert not list(in_tmp_path.iterdir()), "the audit writes nothing where it runs"

    wrong = run_module("lightning_kit.placement", *GENERIC_IMAGE, "--model.lr", "fast", cwd=in_tmp_path)
    assert wrong.returncode == EXIT_USAGE, wrong.stdout + wrong.stderr
    [line] = wrong.stderr.strip().splitlines()
    assert line.startswith("error: ") and "python -m lightning_kit.placement" in line and "lr" in line, line


def test_the_generic_command_line_audits_a_projects_classes(in_tmp_path, capsys):
    """``lightning_kit.gpu_audit.main`` with GenericCLI (its default), in this process."""
    with pytest.raises(SystemExit) as exit_info:
        command.main(GENERIC_IMAGE)
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_PASSED, out
    assert_every_stage(out)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["flat", "train-val"])
def test_the_command_line_audit_passes_an_image_folder_without_a_test_split(in_tmp_path, layout, capsys):
    """configs/image_folder.yaml on the documented layouts without test/: fit and validate pass, exit 0,
    and the report says test and predict were skipped; with a test/ folder they are audited too."""
    from test_folders import write_images

    root = in_tmp_path / "images"
    for split in ("train", "val") if layout == "train-val" else ("",):
        write_images(root / split, per_class=6)
    args = ["--config", str(PROJECT / "configs" / "image_folder.yaml"), "--data.root", str(root)]
    args += ["--data.image_size", "16", "--data.batch_size", "4"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_PASSED, out
    assert "note: test skipped: ImageFolderDataModule has no data for it" in out
    assert "note: predict skipped: ImageFolderDataModule has no data for it" in out
    assert "validate on simgpu:1 (DDP rank 1 of 2)" in out and "test on simgpu" not in out
    assert "Every stage the data defines ran on the simulated GPUs" in out

    if layout == "train-val":
        write_images(root / "test", per_class=2)
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        out = capsys.readouterr().out
        assert exit_info.value.code == EXIT_PASSED and "skipped" not in out, out
        assert "test on simgpu:1 (DDP rank 1 of 2)" in out and "predict on simgpu:0" in out


class PlainAttributeNet(nn.Module):
    """A network for either task's data whose output offset is a plain attribute, not a buffer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(1, num_classes)
        self.offset = torch.zeros(1)

    def forward(self, inputs):
        return self.head(inputs.float().flatten(1).mean(dim=1, keepdim=True)) + self.offset  # CPU offset


@pytest.mark.parametrize("task", PROJECTS)
def test_the_command_line_audit_exits_1_at_a_bug(in_tmp_path, task, capsys):
    project, cli_class = PROJECTS[task]
    config = str(project / "configs" / "synthetic.yaml")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", config, "--model.net", f"{__name__}.PlainAttributeNet"], cli_class)
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_FAILED
    assert f"{__file__}:{line_of('# CPU offset', __file__)}" in out and "`net.offset`, a plain tensor attribute" in out


def test_a_wrong_argument_is_one_line_with_exit_2(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config, "--model.lr", "fast"])
    assert exit_info.value.code == EXIT_USAGE


# A project's module, imported by the command: a CUDA guard at its top (the seed's own first line) and in a
# constructor takes its GPU branch there, as on a GPU machine, where each process imports and builds it before
# Lightning sets that process's GPU: what it makes on the GPU then is on GPU 0 in every process.
GUARDED_MODULE = """
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{module_line}
BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 3)
        {init_line}

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self.net(features + {added}), labels)  # the guarded tensor

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader([BATCH] * 2, batch_size=None)
"""


@pytest.mark.parametrize(
    ("module_line", "init_line", "added", "bug"),  # bug: the operation that fails in DDP's second process
    [
        ("", "", "torch.zeros(8, device=DEVICE)", None),  # "cuda" is each process's own GPU
        ("", "", 'torch.zeros(8, device="cuda:0" if torch.cuda.is_available() else "cpu")', "zeros"),
        ("", "self.extra = torch.ones(8).to(DEVICE)", "self.extra", "aten.add.Tensor"),
        ("", 'self.register_buffer("extra", torch.ones(8, device=DEVICE))', "self.extra", None),
        (
            "",
            "self.extra = torch.ones(8).cuda() if torch.cuda.is_available() else torch.ones(8)",
            "(self.extra if self.extra.device == features.device else self.extra.to(features.device))",
            None,
        ),
        ("CONSTANT = torch.ones(8, device=DEVICE)", "", "CONSTANT", "aten.add.Tensor"),
        ("", "self.net = nn.Linear(8, 3).to(DEVICE)", "0", None),  # a module's parameters: moved by Lightning
    ],
)
def test_a_cuda_guard_at_import_or_in_a_constructor_takes_its_gpu_branch(
    in_tmp_path, monkeypatch, capsys, module_line, init_line, added, bug
):
    name = f"guarded_{abs(hash((module_line, init_line, added)))}"  # imported by the command, first
    (in_tmp_path / f"{name}.py").write_text(
        GUARDED_MODULE.format(module_line=module_line, init_line=init_line, added=added)
    )
    monkeypatch.syspath_prepend(str(in_tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        command.main(["--model", f"{name}.Model", "--data", f"{name}.Data"])
    out = capsys.readouterr().out
    if bug is None:
        assert exit_info.value.code == EXIT_PASSED, out
        return
    assert exit_info.value.code == EXIT_FAILED, out
    assert "  fit on simgpu:0                              ok" in out, out  # one GPU runs it
    line = next(n for n, text in enumerate(GUARDED_MODULE.splitlines(), 1) if "# the guarded tensor" in text)
    assert f"FAILED fit on simgpu:1 as DDP rank 1 of 2, Model.training_step: {bug} at {name}.py:{line}" in out
    assert "found at least two devices, cuda:1 and cuda:0!" in out, out
    if "self.extra" in added:
        assert "It is `extra`, a plain tensor attribute, which Lightning does not move" in out, out
