"""An exported model loads without the project and gives the checkpoint's outputs, for images and token ids alike."""

import json
import os
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import HANG_GUARD_S
from image_project.cli import ProjectCLI as ImageCLI
from sequence_project.cli import ProjectCLI as SequenceCLI

from lightning_kit import cli as kit_cli
from lightning_kit.errors import ConfigError
from lightning_kit.export import IMAGES, TOKENS, example_inputs, load_trained
from lightning_kit.export import main as export

# Each project's command line, the fixture of its short run, and what its export must record of its inputs.
TASKS = {
    "image": (ImageCLI, "trained_once", {"kind": IMAGES, "image_size": 32, "varies": [0]}),
    "sequence": (
        SequenceCLI,
        "trained_sequence_once",
        {"kind": TOKENS, "seq_len": 32, "vocab_size": 16, "varies": [0, 1]},
    ),
}

# Run in a fresh interpreter in which this project cannot be imported: the file must be enough.
LOAD_ALONE = """
import json, sys, torch
sys.modules["lightning_kit"] = None
names = {"class_names.json": "", "input.json": ""}
model = torch.export.load(sys.argv[1], extra_files=names).module()
torch.save(model(torch.load("inputs.pt")), "outputs.pt")
json.dump({key: json.loads(value) for key, value in names.items()}, open("extra.json", "w"))
"""

ONNX_ALONE = """
import json, sys, onnx, onnxruntime, torch
sys.modules["lightning_kit"] = None
session = onnxruntime.InferenceSession(sys.argv[1])
(outputs,) = session.run(None, {"inputs": torch.load("inputs.pt").numpy()})
torch.save(torch.from_numpy(outputs), "outputs.pt")
metadata = {prop.key: prop.value for prop in onnx.load(sys.argv[1]).metadata_props}
json.dump({"class_names.json": json.loads(metadata["class_names"])}, open("extra.json", "w"))
"""


@pytest.fixture(scope="module", params=sorted(TASKS))
def trained(request, tmp_path_factory):
    """For each project: a folder with a copy of a short run and a batch of its test inputs; the checkpoint, its
    model and outputs, the export command with the project's command line, and what the file must record."""
    cli_class, runs, recorded = TASKS[request.param]
    folder = tmp_path_factory.mktemp(f"export-{request.param}")
    shutil.copytree(request.getfixturevalue(runs) / "runs", folder / "runs")
    checkpoint = folder / "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        model, datamodule = load_trained(checkpoint, [], cli_class)
    datamodule.setup("test")
    inputs = next(iter(datamodule.test_dataloader()))[0][:5]
    torch.save(inputs, folder / "inputs.pt")
    with torch.no_grad():
        expected = model(inputs).softmax(dim=-1)
    return folder, checkpoint, model, expected, partial(export, cli_class=cli_class), recorded


@pytest.fixture
def in_trained(trained, monkeypatch):
    """``trained``, run in its folder."""
    monkeypatch.chdir(trained[0])
    return trained


def run_alone(script: str, path) -> tuple[torch.Tensor, dict]:
    command = [sys.executable, "-c", script, str(path)]
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD_S)
    with open("extra.json") as file:
        return torch.load("outputs.pt"), json.load(file)


@pytest.mark.slow
def test_the_exported_program_matches_the_checkpoint_without_the_project(in_trained, capsys):
    in_tmp_path, checkpoint, model, expected, export, recorded = in_trained
    export(["--ckpt_path", "last", "--onnx", "no"])
    written = in_tmp_path / "runs/lightning_logs/version_0/model.pt2"
    out = capsys.readouterr().out
    assert f"exported {checkpoint.relative_to(in_tmp_path)} to {written.relative_to(in_tmp_path)}" in out
    outputs, extra = run_alone(LOAD_ALONE, written)
    torch.testing.assert_close(outputs, expected, rtol=1e-5, atol=1e-6)
    assert extra["class_names.json"] == model.class_names
    inputs = torch.load("inputs.pt")
    assert extra["input.json"]["dtype"] == str(inputs.dtype).removeprefix("torch.")
    # What a server decodes requests by: the kind of input, its sizes, and which dimensions vary.
    assert {key: extra["input.json"][key] for key in recorded} == recorded
    # Nothing is replaced without --overwrite.
    with pytest.raises(SystemExit, match=re.escape("model.pt2 exists: give another --output, or --overwrite")):
        export(["--ckpt_path", str(checkpoint), "--onnx", "no"])


@pytest.mark.slow
def test_the_onnx_file_matches_the_checkpoint(in_trained):
    pytest.importorskip("onnxscript", reason="ONNX export needs: pip install onnx onnxscript")
    pytest.importorskip("onnxruntime", reason="checking the ONNX file needs: pip install onnxruntime")
    in_tmp_path, checkpoint, model, expected, export, _ = in_trained
    export(["--ckpt_path", str(checkpoint), "--output", "exported/model.pt2", "--onnx", "yes"])
    outputs, extra = run_alone(ONNX_ALONE, in_tmp_path / "exported/model.onnx")
    torch.testing.assert_close(outputs, expected, rtol=1e-4, atol=1e-5)
    assert extra["class_names.json"] == model.class_names


def test_an_output_that_is_not_pt2_is_one_line(in_tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --output model\.onnx must end in \.pt2"):
        export(["--ckpt_path", "x.ckpt", "--output", "model.onnx"])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("folder.pt2", "--output folder.pt2 names a folder"),
        ("new.pt2/", "--output new.pt2/ names a folder"),
        ("file.pt2/model.pt2", "--output file.pt2/model.pt2 cannot be written (file.pt2 is not a folder)"),
        ("file.pt2", "--output file.pt2 exists: give another --output, or --overwrite"),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_before_the_checkpoint_is_read(in_tmp_path, given, expected):
    """A folder, a path under a file or an existing file as --output stops at once: x.ckpt is never looked for."""
    (in_tmp_path / "folder.pt2").mkdir()
    (in_tmp_path / "file.pt2").write_text("mine")
    with pytest.raises(SystemExit, match="^" + re.escape(f"error: {expected}")):
        export(["--ckpt_path", "x.ckpt", "--output", given, "--onnx", "no"])
    assert (in_tmp_path / "file.pt2").read_text() == "mine"


def test_a_data_module_that_says_nothing_of_its_inputs_is_one_line():
    """A data module with neither an image_size nor a seq_len and a vocab_size: the export cannot tell the inputs."""
    with pytest.raises(
        ConfigError, match=r"^the data module LightningDataModule has neither an image_size nor a seq_len"
    ):
        example_inputs(L.LightningDataModule())


@pytest.mark.slow
def test_the_projects_export_command_runs_in_a_fresh_process(trained_once, in_tmp_path):
    """``python -m image_project.export --ckpt_path last``: the project's thin command, with its command line."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "runs")
    command = [sys.executable, "-m", "image_project.export", "--ckpt_path", "last", "--onnx", "no"]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    written = Path("runs/lightning_logs/version_0/model.pt2")
    assert f"to {written}" in done.stdout and written.is_file()
    missing = subprocess.run(
        command[:3], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert missing.returncode == 2 and missing.stderr.startswith("usage: python -m image_project.export"), missing


# A project without a KitCLI: a LightningModule without a `net` or class names, and a data module, in its own module.
PLAIN_PROJECT = """
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Pictures(L.LightningDataModule):
    image_size = 8

    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, 3, (16,), generator=generator)
        return DataLoader(TensorDataset(images, labels), batch_size=self.hparams.batch_size)


class Sentences(Pictures):
    image_size = None
    seq_len, vocab_size = 6, 5

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 5, (16, 6), generator=generator)
        labels = torch.randint(0, 3, (16,), generator=generator)
        return DataLoader(TensorDataset(tokens, labels), batch_size=self.hparams.batch_size)


class Tiny(L.LightningModule):
    def __init__(self, tokens: bool = False, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(5, 4) if tokens else None
        self.layer = nn.Linear(4 if tokens else 3 * 8 * 8, 3)

    def forward(self, inputs):
        features = self.embed(inputs).mean(dim=1) if self.embed is not None else inputs.float().flatten(1) / 255
        return self.layer(features)

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        return nn.functional.cross_entropy(self(inputs), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "tokens", "recorded"),
    [("Pictures", False, {"kind": IMAGES, "image_size": 8}), ("Sentences", True, {"kind": TOKENS, "vocab_size": 5})],
    ids=["images", "tokens"],
)
def test_a_project_without_a_kit_cli_exports_with_its_model_and_data_named(
    in_tmp_path, monkeypatch, fast_args, data, tokens, recorded
):
    """``python -m lightning_kit.export --model ... --data ... --ckpt_path ...`` (GenericCLI) of a run trained with
    GenericCLI: the model itself is the network, its classes are numbered, its inputs follow from the data module."""
    (in_tmp_path / "plain.py").write_text(PLAIN_PROJECT)
    monkeypatch.syspath_prepend(str(in_tmp_path))
    named = ["--model", "plain.Tiny", "--model.tokens", str(tokens), "--data", f"plain.{data}"]
    quick = ["--accelerator", "cpu", "--max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    kit_cli.main(kit_cli.GenericCLI, ["fit", *named, *quick])
    checkpoint = Path("runs/lightning_logs/version_0/checkpoints/last.ckpt")
    command = [sys.executable, "-m", "lightning_kit.export", *named[:2], *named[4:], "--ckpt_path", str(checkpoint)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(in_tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [*command, "--onnx", "no"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model, datamodule = load_trained(checkpoint, named[:2] + named[4:])
    inputs = next(iter(datamodule.train_dataloader()))[0]
    torch.save(inputs, "inputs.pt")
    outputs, extra = run_alone(LOAD_ALONE, checkpoint.parent.parent / "model.pt2")
    with torch.no_grad():
        torch.testing.assert_close(outputs, model(inputs).softmax(dim=-1), rtol=1e-5, atol=1e-6)
    assert extra["class_names.json"] == ["0", "1", "2"]
    assert {key: extra["input.json"][key] for key in recorded} == recorded
