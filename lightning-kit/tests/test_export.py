"""An exported model loads without this project and gives the checkpoint's outputs."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import HANG_GUARD_S

from lightning_kit.export import load_trained
from lightning_kit.export import main as export

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


@pytest.fixture(scope="module")
def trained(trained_once, tmp_path_factory):
    """A folder with a copy of a short run and a batch of its test inputs; its model, and the outputs."""
    folder = tmp_path_factory.mktemp("export")
    shutil.copytree(trained_once / "runs", folder / "runs")
    checkpoint = folder / "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        model, datamodule = load_trained(checkpoint, [])
    datamodule.setup("test")
    inputs = next(iter(datamodule.test_dataloader()))[0][:5]
    torch.save(inputs, folder / "inputs.pt")
    with torch.no_grad():
        expected = model(inputs).softmax(dim=-1)
    return folder, checkpoint, model, expected


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
    in_tmp_path, checkpoint, model, expected = in_trained
    export(["--ckpt_path", "last", "--onnx", "no"])
    written = in_tmp_path / "runs/lightning_logs/version_0/model.pt2"
    out = capsys.readouterr().out
    assert f"exported {checkpoint.relative_to(in_tmp_path)} to {written.relative_to(in_tmp_path)}" in out
    outputs, extra = run_alone(LOAD_ALONE, written)
    torch.testing.assert_close(outputs, expected, rtol=1e-5, atol=1e-6)
    assert extra["class_names.json"] == model.class_names
    inputs = torch.load("inputs.pt")
    assert extra["input.json"]["dtype"] == str(inputs.dtype).removeprefix("torch.")
    # Nothing is replaced without --overwrite.
    with pytest.raises(SystemExit, match=re.escape("model.pt2 exists: give another --output, or --overwrite")):
        export(["--ckpt_path", str(checkpoint), "--onnx", "no"])


@pytest.mark.slow
def test_the_onnx_file_matches_the_checkpoint(in_trained):
    pytest.importorskip("onnxscript", reason="ONNX export needs: pip install onnx onnxscript")
    pytest.importorskip("onnxruntime", reason="checking the ONNX file needs: pip install onnxruntime")
    in_tmp_path, checkpoint, model, expected = in_trained
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
