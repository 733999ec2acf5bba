"""An exported model loads without the project and gives the checkpoint's outputs, for images and token ids alike,
and for any other network: a model of tensors, its inputs found from the model's example_input_array or a batch."""

import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import lightning as L
import pytest
import torch
from conftest import HANG_GUARD_S
from image_project.cli import ProjectCLI as ImageCLI
from sequence_project.cli import ProjectCLI as SequenceCLI
from torch import nn

from lightning_kit import cli as kit_cli
from lightning_kit.errors import ConfigError, UserError
from lightning_kit.export import IMAGES, TENSORS, TOKENS, example_inputs, load_trained
from lightning_kit.export import export as export_model
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


def test_onnx_yes_without_onnx_installed_is_one_line_before_the_checkpoint_is_read(in_tmp_path, monkeypatch):
    """What --onnx yes needs is looked for first: x.ckpt is never read, nor the model built."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnx" else real_find_spec(name))
    with pytest.raises(SystemExit, match="^" + re.escape("error: --onnx yes needs the onnx and onnxscript packages")):
        export(["--ckpt_path", "x.ckpt", "--onnx", "yes"])
    assert not (in_tmp_path / "model.pt2").exists()


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
    assert missing.returncode == 2 and missing.stderr.startswith(
        "error: the following arguments are required: --ckpt_path (options: python -m image_project.export --help)"
    ), missing


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


# Models of tensors: small networks of each form a batch or an example_input_array can take, trained on nothing
# (what is tested is what the file takes and answers, not what the network learned).


class Regression(L.LightningModule):
    """A GRU over a window, forecasting 4 values: ``forward(history)``, its batches dicts with a ``target``."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(2, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(history)  # (layers, batch, hidden)
        return self.head(last[-1])  # (batch, 4)


class Windows(L.LightningDataModule):
    """Dict batches ``{"history": (B, 24, 2), "target": (B, 4)}``, of a training loader alone; records the stages
    ``setup`` was called for."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[str] = []

    def setup(self, stage: str) -> None:
        self.stages.append(stage)
        generator = torch.Generator().manual_seed(0)
        self.items = [{"history": torch.randn(24, 2, generator=generator), "target": torch.zeros(4)} for _ in range(8)]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.items, batch_size=4)


class Features(nn.Module):
    """A tabular network: ``features`` (B, 5) to ``outputs`` values each, or one (B,) where ``outputs`` is None."""

    def __init__(self, outputs: int | None) -> None:
        super().__init__()
        self.outputs = outputs
        self.layer = nn.Linear(5, outputs or 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.layer(features)
        return out if self.outputs else out.squeeze(-1)


class Tabular(L.LightningModule):
    """The tabular network as its ``net``, as a project's LightningModule holds it."""

    def __init__(self, outputs: int | None) -> None:
        super().__init__()
        self.net = Features(outputs)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


class Table(L.LightningDataModule):
    """(x, y) batches of a TensorDataset, x (B, 5) float32 and y (B,), from a predict loader and a test loader."""

    def _loader(self, seed: int):
        generator = torch.Generator().manual_seed(seed)
        rows = torch.utils.data.TensorDataset(torch.randn(6, 5, generator=generator), torch.zeros(6))
        return torch.utils.data.DataLoader(rows, batch_size=3)

    def predict_dataloader(self):
        return self._loader(0)

    def test_dataloader(self):
        raise AssertionError("the predict loader comes first")


class Statistics(L.LightningModule):
    """``forward(values, mask)``, of two tensors (float32 and bool), answers a dict; the data gives them by name."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Linear(3, 3)

    def forward(self, values: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        kept = self.scale(values) * mask  # (batch, 3)
        return {"total": kept.sum(-1), "scaled": kept}


class Pairs(L.LightningDataModule):
    """Dict batches of values, a mask and a label, of a validation loader alone."""

    def val_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        items = [
            {"values": torch.randn(3, generator=generator), "mask": torch.rand(3, generator=generator) > 0.5, "y": 1}
            for _ in range(4)
        ]
        return torch.utils.data.DataLoader(items, batch_size=4)


class Given(L.LightningModule):
    """A model that says what it takes: its ``example_input_array``, one row of two positional tensors; it answers
    a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)
        self.example_input_array = (torch.randn(1, 3), torch.randn(1, 3))

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(left - right), (left * right).sum(-1)


def exported_file(path: Path) -> tuple[nn.Module, dict, list]:
    """The program of an exported file, as PyTorch alone loads it, and its input.json and class_names.json."""
    extra = {"input.json": "", "class_names.json": ""}
    program = torch.export.load(path, extra_files=extra)
    return program.module(), json.loads(extra["input.json"]), json.loads(extra["class_names.json"])


def answered_alike(exported, model: nn.Module, *args, **kwargs) -> None:
    """The exported program answers as the model does, whatever the nesting of the outputs."""
    with torch.no_grad():
        torch.testing.assert_close(exported(*args, **kwargs), model(*args, **kwargs), rtol=1e-5, atol=1e-6)


def test_a_dict_batch_is_taken_by_forwards_parameter_names(tmp_path):
    """A regression model without example_input_array or sizes: its inputs are the first batch of the data module's
    only loader (setup for "fit"), the dict's entries that forward names, passed by keyword; any batch size."""
    model, data = Regression(), Windows()
    written = export_model(model, data, tmp_path / "model.pt2", onnx="no")
    assert written.files == [tmp_path / "model.pt2"] and written.no_onnx is None
    assert data.stages == ["fit"]
    exported, described, class_names = exported_file(tmp_path / "model.pt2")
    assert described == {
        "kind": TENSORS,
        "passed": "keyword",
        "inputs": [{"name": "history", "dtype": "float32", "shape": [24, 2]}],
    }
    assert class_names == []  # no softmax, no classes: the outputs as they are
    for rows in (1, 5):
        answered_alike(exported, model, history=torch.randn(rows, 24, 2))


@pytest.mark.parametrize("outputs", [None, 3], ids=["one-value", "three-values"])
def test_a_tuple_batch_gives_its_first_items_to_the_models_forward(tmp_path, outputs):
    """(x, y) batches of a tabular model with a ``net``: the model's forward is exported, on x (its one required
    parameter), taken by position; it answers (B,) or (B, K) as it does, from the predict loader first."""
    model = Tabular(outputs)
    export_model(model, Table(), tmp_path / "model.pt2", onnx="no")
    exported, described, _ = exported_file(tmp_path / "model.pt2")
    assert described["passed"] == "positional"
    assert described["inputs"] == [{"name": "features", "dtype": "float32", "shape": [5]}]
    features = torch.randn(7, 5)
    answered_alike(exported, model, features)
    assert exported(features).shape == ((7, outputs) if outputs else (7,))


class Rescaled(Tabular):
    """A forward that does more than its net: the file answers what forward answers, not what the net does."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features) * 1000 + 7


class Spectra(L.LightningModule):
    """An audio model: clips of 2 channels and any length, a convolution over time, then the mean over time; and
    a float64 gain, and int64 ids of a speaker: forward(audio, gain, speaker) answers (logits, embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.speakers = nn.Embedding(5, 4)

    def forward(self, audio: torch.Tensor, gain: torch.Tensor, speaker: torch.Tensor):
        features = self.conv(audio * gain[:, None, None].float()).mean(-1)  # (B, 4), whatever the length
        embedding = self.speakers(speaker)
        return features + embedding, {
            "embedding": embedding,
            "length": audio.new_full((audio.shape[0],), audio.shape[-1]),
        }


class PaddedClips(L.LightningDataModule):
    """Batches of clips padded to 50 samples, as a collate function pads them."""

    def predict_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        items = [
            (torch.randn(2, 50, generator=generator), torch.tensor(0.5, dtype=torch.float64), torch.tensor(index % 5))
            for index in range(6)
        ]
        return torch.utils.data.DataLoader(items, batch_size=3)


def test_the_file_answers_what_forward_answers_not_what_its_net_does(tmp_path):
    model = Rescaled(3)
    export_model(model, Table(), tmp_path / "model.pt2", onnx="no")
    exported, _, _ = exported_file(tmp_path / "model.pt2")
    features = torch.randn(4, 5)
    answered_alike(exported, model, features)
    assert not torch.allclose(exported(features), model.net(features))


def test_forwards_inputs_of_any_dtype_and_lengths_that_vary_are_taken_as_forward_takes_them(tmp_path):
    """Three inputs (float32 clips, float64 gains, int64 ids) of a padded batch: the clips' length is free, as the
    network lets it be, the channels fixed; the file takes clips of other lengths and answers forward's tuple."""
    model = Spectra()
    export_model(model, PaddedClips(), tmp_path / "model.pt2", onnx="no")
    exported, described, _ = exported_file(tmp_path / "model.pt2")
    assert described["inputs"][0] == {
        "name": "audio",
        "dtype": "float32",
        "shape": [2, None],
        "ranges": [None, [2, None]],
    }
    assert [entry["dtype"] for entry in described["inputs"]] == ["float32", "float64", "int64"]
    for length in (17, 80):
        inputs = (torch.randn(3, 2, length), torch.rand(3, dtype=torch.float64), torch.tensor([0, 4, 2]))
        answered_alike(exported, model, *inputs)


class ScalesByChance(Tabular):
    """A forward that scales by a Python random number: torch.export freezes the number it drew while tracing."""

    def __init__(self) -> None:
        super().__init__(3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features) * random.uniform(0.5, 2.0)


class SpecialisedLength(Spectra):
    """A forward that takes its example's length another way (a Python branch on it): the file, that length alone."""

    def forward(self, audio, gain, speaker):
        logits, extra = super().forward(audio, gain, speaker)
        return (logits * 2 if audio.shape[-1] == 8 else logits), extra


def test_a_file_that_answers_otherwise_than_forward_is_refused_and_not_written(tmp_path):
    random.seed(0)
    with pytest.raises(UserError) as refused:
        export_model(ScalesByChance(), Table(), tmp_path / "model.pt2", onnx="no")
    message = str(refused.value)
    assert message.startswith(
        "the exported file of ScalesByChance answers the first batch of Table.predict_dataloader()"
    )
    assert "otherwise than its forward (Tensor-likes are not close!" in message
    assert (
        "Greatest absolute difference: " in message and "\n" not in message and message.endswith("nothing was written")
    )
    assert not (tmp_path / "model.pt2").exists()


def test_a_file_that_cannot_take_the_datas_batch_is_refused_and_not_written(tmp_path):
    model = SpecialisedLength()
    model.example_input_array = (torch.randn(2, 2, 8), torch.ones(2, dtype=torch.float64), torch.tensor([0, 1]))
    with pytest.raises(UserError) as refused:
        export_model(model, PaddedClips(), tmp_path / "model.pt2", onnx="no")
    message = str(refused.value)
    assert message.startswith("the exported file of SpecialisedLength cannot take the first batch of PaddedClips")
    assert (
        message.endswith("which its forward takes (" + message.split("which its forward takes (")[1])
        and "\n" not in message
    )
    assert not (tmp_path / "model.pt2").exists()


class OneAlone(Given):
    """A forward that answers a batch of one example otherwise (torch.export traces a batch of 2, its other branch)."""

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        answered = super().forward(left, right)
        return (answered[0] * 0, answered[1]) if left.shape[0] == 1 else answered


class Squeezed(Given):
    """A forward whose squeeze() takes the batch dimension away from a batch of one example."""

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        answered = super().forward(left, right)
        return answered[0].unsqueeze(1).squeeze(), answered[1]


class Centred(Given):
    """A forward whose answer to one example depends on the others of its batch (their mean)."""

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(left - left.mean(0, keepdim=True), right)


class Referenced(Given):
    """A forward that answers each example beside the first of its batch: the first alone answers as within it."""

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(left - left[:1], right)


class Counting(Given):
    """A forward that counts its calls in a buffer, and answers by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        answered = super().forward(left, right)
        return answered[0] * self.calls, answered[1]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            OneAlone(),
            "the exported file of OneAlone answers the last example of the example_input_array of OneAlone otherwise "
            "than its forward (Tensor-likes are not close!",
        ),
        (
            Squeezed(),
            "for the last example of the example_input_array of Squeezed, Squeezed's forward answers a tensor of "
            "shape (2,) for 1 examples, not one row per example, and the server answers each example its row: "
            "nothing was written",
        ),
        (
            Centred(),
            "Centred's forward answers the last example of the example_input_array of Centred alone otherwise than "
            "within that batch (Tensor-likes are not close!",
        ),
        (
            Referenced(),
            "Referenced's forward answers the last example of the example_input_array of Referenced alone otherwise "
            "than within that batch (Tensor-likes are not close!",
        ),
        (
            Counting(),
            "Counting's forward changes its buffer calls as it answers (a counter, a cache, running statistics of a "
            "module in training mode): the exported file would answer each call otherwise than forward does, and "
            "each server process otherwise: nothing was written",
        ),
    ],
    ids=["branch-on-one", "squeeze", "batch-statistics", "first-of-batch", "buffer-changed"],
)
def test_a_file_that_would_answer_an_example_otherwise_than_forward_is_one_line(tmp_path, model, expected):
    """torch.export traces the example's batch of 2 once: a batch of 1 (a request alone), an answer that depends on
    the batch, or on the calls before, would be answered otherwise than forward answers it; each is refused."""
    model.example_input_array = (torch.randn(4, 3), torch.randn(4, 3))
    with pytest.raises(UserError) as refused:
        export_model(model, None, tmp_path / "model.pt2", onnx="no")
    message = str(refused.value)
    assert message.startswith(expected) and "\n" not in message and message.endswith("nothing was written"), message
    assert not (tmp_path / "model.pt2").exists()


class Doubling(Given):
    """A forward that doubles its input in place: each call of the check is given its own copy."""

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        left.mul_(2)
        return super().forward(left, right)


def test_a_forward_that_changes_its_input_in_place_is_exported(tmp_path):
    model = Doubling()
    export_model(model, None, tmp_path / "model.pt2", onnx="no")
    exported, _, _ = exported_file(tmp_path / "model.pt2")
    for rows in (1, 3):
        left, right = torch.randn(rows, 3), torch.randn(rows, 3)
        with torch.no_grad():
            torch.testing.assert_close(exported(left.clone(), right), model.eval()(left.clone(), right))


def test_an_example_input_array_comes_first_and_one_row_is_enough(tmp_path):
    """A model's example_input_array (a tuple: positional arguments) is what the file takes, though the data module
    has an image_size; its one row is repeated, so the batch still varies. It answers its tuple."""
    model = Given()
    export_model(model, SimpleNamespace(image_size=8), tmp_path / "model.pt2", onnx="no")
    exported, described, _ = exported_file(tmp_path / "model.pt2")
    assert described["kind"] == TENSORS and described["passed"] == "positional"
    assert [entry["name"] for entry in described["inputs"]] == ["left", "right"]
    left, right = torch.randn(4, 3), torch.randn(4, 3)
    answered_alike(exported, model, left, right)
    assert [tuple(output.shape) for output in exported(left, right)] == [(4, 2), (4,)]


def test_two_tensors_by_keyword_answer_a_dict_and_the_onnx_file_names_them(tmp_path):
    """forward(values, mask) of a dict batch: two inputs of their own dtypes by keyword, and a dict answered; the
    .onnx file takes them by forward's parameter names and answers the dict's keys."""
    pytest.importorskip("onnxscript", reason="ONNX export needs: pip install onnx onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime", reason="checking the ONNX file needs: pip install onnxruntime")
    model = Statistics()
    written = export_model(model, Pairs(), tmp_path / "model.pt2")
    assert written.files == [tmp_path / "model.pt2", tmp_path / "model.onnx"]
    exported, described, _ = exported_file(tmp_path / "model.pt2")
    assert described["passed"] == "keyword"
    assert described["inputs"] == [
        {"name": "values", "dtype": "float32", "shape": [3]},
        {"name": "mask", "dtype": "bool", "shape": [3]},
    ]
    values, mask = torch.randn(5, 3), torch.rand(5, 3) > 0.5
    answered_alike(exported, model, values=values, mask=mask)
    session = onnxruntime.InferenceSession(tmp_path / "model.onnx")
    assert [given.name for given in session.get_inputs()] == ["values", "mask"]
    names = [answer.name for answer in session.get_outputs()]
    answers = session.run(None, {"values": values.numpy(), "mask": mask.numpy()})
    with torch.no_grad():
        expected = model(values, mask)
    assert names == ["total", "scaled"]
    for name, answer in zip(names, answers, strict=True):
        torch.testing.assert_close(torch.from_numpy(answer), expected[name], rtol=1e-5, atol=1e-6)


def test_a_network_torch_onnx_cannot_convert_still_has_its_pt2(tmp_path, monkeypatch):
    """Where torch.onnx fails, the .pt2 is written all the same, and one line says why there is no .onnx."""
    pytest.importorskip("onnxscript", reason="ONNX export needs: pip install onnx onnxscript")

    def unsupported(*args, **kwargs):
        raise RuntimeError("no conversion for aten::weird\nand more lines")

    monkeypatch.setattr(torch.onnx, "export", unsupported)
    written = export_model(Given(), None, tmp_path / "model.pt2")
    assert written.files == [tmp_path / "model.pt2"] and not (tmp_path / "model.onnx").exists()
    assert written.no_onnx == "torch.onnx cannot export Given (RuntimeError: no conversion for aten::weird)"
    exported_file(tmp_path / "model.pt2")  # loads
    # Exported again over an earlier export's files: its .onnx, of another network, does not stay beside the .pt2.
    (tmp_path / "model.onnx").write_bytes(b"an earlier export's")
    written = export_model(Given(), None, tmp_path / "model.pt2", overwrite=True)
    assert written.no_onnx.endswith(f"; the {tmp_path / 'model.onnx'} of an earlier export was removed")
    assert not (tmp_path / "model.onnx").exists()


class Branching(L.LightningModule):
    """A forward that branches on its data: it runs, but torch.export cannot export it."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs if inputs.sum() > 0 else -inputs


class Summing(Regression):
    """A forward that answers one number for the whole batch: no row per example to answer a request with."""

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        return super().forward(history).sum()


class Empty(L.LightningDataModule):
    """A data module with no loader and no sizes."""


TAKES = (
    "set example_input_array on {model} to what its forward takes (a tensor, a tuple or a dict of tensors), "
    "or give the data module image_size, or seq_len and vocab_size"
)


@pytest.mark.parametrize(
    ("model", "datamodule", "expected"),
    [
        (
            Regression(),
            Empty(),
            "the export cannot tell what Regression takes (the data module Empty has no dataloader): "
            + TAKES.format(model="Regression"),
        ),
        (
            Regression(),
            Pairs(),
            "the export cannot tell what Regression takes (the first batch of Pairs.val_dataloader() is a dict of "
            "values, mask, y, with no history of forward(history)): " + TAKES.format(model="Regression"),
        ),
        (
            Regression(),
            Table(),
            "the export cannot tell what Regression takes (Regression cannot take the first batch of "
            "Table.predict_dataloader(), a list of 2: its forward raised RuntimeError: ...): "
            + TAKES.format(model="Regression"),
        ),
        (
            Summing(),
            Windows(),
            "the export cannot tell what Summing takes (for the first batch of Windows.train_dataloader(), a dict of "
            "history, target, Summing's forward answers a tensor of shape () for 2 examples, not one row per "
            "example): " + TAKES.format(model="Summing"),
        ),
        (
            Tabular(3),
            SimpleNamespace(image_size=8),
            "Tabular cannot take uint8 images of 8x8 (the data module's image_size): its forward raised "
            "RuntimeError: ...",
        ),
    ],
    ids=["no-loader", "no-parameter-of-forward", "a-batch-forward-fails-on", "no-row-per-example", "wrong-sizes"],
)
def test_a_model_whose_inputs_cannot_be_found_is_one_line_naming_example_input_array(model, datamodule, expected):
    """No example_input_array, sizes or batch that forward runs on: one line naming the model, and what to set
    (``...``: PyTorch's own words, the first line of its error)."""
    with pytest.raises(ConfigError) as refused:
        example_inputs(model, datamodule)
    assert re.fullmatch(re.escape(expected).replace(re.escape("..."), "[^\\n]+"), str(refused.value)), refused.value


def test_an_example_input_array_forward_does_not_take_is_one_line(tmp_path):
    model = Given()
    model.example_input_array = {"left": torch.randn(2, 3)}
    with pytest.raises(ConfigError) as refused:
        export_model(model, None, tmp_path / "model.pt2", onnx="no")
    message = str(refused.value)
    assert message.startswith("Given cannot take the example_input_array of Given: its forward raised TypeError")
    assert message.endswith(": set example_input_array on Given to what its forward takes") and "\n" not in message
    assert not (tmp_path / "model.pt2").exists()


class Answer(NamedTuple):
    difference: torch.Tensor
    product: torch.Tensor


class AnswersANamedTuple(Given):
    def forward(self, left: torch.Tensor, right: torch.Tensor) -> dict[str, Answer]:
        return {"answer": Answer(*super().forward(left, right))}


def test_a_forward_answering_a_named_tuple_is_one_line_saying_what_to_answer(tmp_path):
    """torch.export cannot save a NamedTuple's class (nested too), whatever the example: the answer is the fix."""
    with pytest.raises(ConfigError) as refused:
        export_model(AnswersANamedTuple(), None, tmp_path / "model.pt2", onnx="no")
    assert str(refused.value) == (
        "AnswersANamedTuple's forward answers a NamedTuple, Answer, whose class torch.export cannot save: answer a "
        "dict of its fields (._asdict()) or a tuple"
    )
    assert not (tmp_path / "model.pt2").exists()


def test_a_network_torch_export_cannot_export_is_one_line(tmp_path, capfd):
    """torch.export's own error, as one line naming the model and the first line of its reason; nothing written,
    and nothing printed before it (torch.export prints the graph it traced where it fails)."""
    model = Branching()
    model.example_input_array = torch.randn(2, 3)
    with pytest.raises(UserError) as refused:
        export_model(model, None, tmp_path / "model.pt2", onnx="no")
    message = str(refused.value)
    assert message.startswith("torch.export cannot export Branching (") and "\n" not in message, message
    assert not (tmp_path / "model.pt2").exists()
    assert capfd.readouterr().err == ""


# An export under a file size limit, in a process of its own: PyTorch's archive writer, had it the file, would end
# that process (SIGABRT) rather than raise.
EXPORT_UNDER_LIMIT = """
import resource, sys, torch
from pathlib import Path
from torch import nn
import lightning as L
from lightning_kit.errors import UserError
from lightning_kit.export import export

class Wide(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(64, 64)
        self.example_input_array = torch.randn(1, 64)

    def forward(self, x):
        return self.layer(x)

resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    export(Wide(), None, Path(sys.argv[1]), overwrite=True, onnx="no")
except UserError as err:
    sys.exit(f"error: {err}")
"""


@pytest.mark.parametrize("limit", [1024, 12 * 1024], ids=["first-kilobyte", "part-way"])
def test_an_export_past_the_file_size_limit_is_one_line_and_leaves_the_earlier_file(tmp_path, limit):
    """Past ``ulimit -f`` the export ends in one line naming the file and the limit, exit 1, not SIGABRT; the
    file an earlier export wrote is still there, whole, and no temporary file is left beside it."""
    output = tmp_path / "model.pt2"
    output.write_bytes(b"an earlier export")
    run = subprocess.run(
        [sys.executable, "-c", EXPORT_UNDER_LIMIT, str(output), str(limit)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_S,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1, run.stderr[-2000:]
    assert lines[-1].startswith(f"error: --output: {output} could not be written (File too large"), lines
    assert "ulimit -f" in lines[-1] and "Traceback" not in run.stderr
    assert output.read_bytes() == b"an earlier export"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.pt2"]
