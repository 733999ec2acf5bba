"""Export a checkpoint to one self-contained file, for people and services without this project.

    python -m {{ cookiecutter.project_slug }}.export --ckpt_path last
    python -m {{ cookiecutter.project_slug }}.export --ckpt_path runs/lightning_logs/version_3/checkpoints/last.ckpt --output model.pt2

writes ``model.pt2`` (``torch.export``) beside the run's checkpoints folder, and
``model.onnx`` when the ``onnx`` and ``onnxscript`` packages are installed. Each takes
{%- if cookiecutter.task == "image" %}
raw ``uint8`` images ``(B, 3, S, S)``, normalises them inside and returns class
{%- else %}
token ids ``(B, T)``, ``int64``, and returns class
{%- endif %}
probabilities ``(B, classes)``; the class names travel in the file. Loading needs
PyTorch alone::

    import json, torch
    names = {"class_names.json": ""}
    model = torch.export.load("model.pt2", extra_files=names).module()
    probabilities = model(inputs)
    classes = json.loads(names["class_names.json"])
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import yaml
from torch import nn

from .checkpoints import check_architecture, latest_checkpoint, read_checkpoint, written_whole
from .cli import build, expand_shortcuts
from .errors import ConfigError, UserError
from .files import check_output_file
from .trust import check_trusted, read_config

# What of a run's config.yaml builds its model and data.
RUN_SETTINGS = ("seed_everything", "model", "data")
CLASS_NAMES_FILE = "class_names.json"
INPUT_FILE = "input.json"


class Probabilities(nn.Module):
    """What an exported file holds: the trained network, then a softmax over its logits."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs).softmax(dim=-1)


def example_inputs(datamodule) -> tuple[torch.Tensor, dict[int, torch.export.Dim]]:
    """Inputs of the shape and type the network takes, and which of their dimensions may vary."""
{%- if cookiecutter.task == "image" %}
    size = datamodule.image_size
    return torch.zeros(2, 3, size, size, dtype=torch.uint8), {0: torch.export.Dim("batch")}
{%- else %}
    length = torch.export.Dim("length", min=2, max=datamodule.seq_len)
    return torch.zeros(2, datamodule.seq_len, dtype=torch.long), {0: torch.export.Dim("batch"), 1: length}
{%- endif %}


def load_trained(ckpt_path: Path, args: list[str]) -> tuple[nn.Module, object]:
    """The Classifier of ``ckpt_path`` with its weights, and its data module, built from its run's ``config.yaml``."""
    config = ckpt_path.parent.parent / "config.yaml"
    given = any(arg in ("-c", "--config") or arg.startswith("--config=") for arg in args)
    if not given and not config.is_file():
        raise ConfigError(f"no config.yaml in {config.parent}: give the run's settings with --config")
    trained = read_checkpoint(ckpt_path, args)
    settings = []
    if not given:
        # The run's settings, without those of `fit` itself (ckpt_path, ...), which building the model does not take.
        run = read_config(config) or {}
        check_trusted(run, config, args, [config.parent])  # read as data: built only from code it may import
        settings = ["--config", yaml.safe_dump({key: run[key] for key in RUN_SETTINGS if key in run})]
    model, datamodule = build([*settings, *args])
    check_architecture(ckpt_path, trained, model)
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), datamodule


def export(model, datamodule, output: Path, overwrite: bool = False, onnx: str = "auto") -> list[Path]:
    """Write ``output`` (``.pt2``), and its ``.onnx`` sibling as ``onnx`` says; return the files written.

    Each is written beside its name and renamed into place: a link at that name is replaced, not written through.
    """
    targets = check_outputs(output, overwrite, onnx)
    if onnx == "yes" and not _has_onnx():
        raise ConfigError("--onnx yes needs the onnx and onnxscript packages: pip install onnx onnxscript")
    wrapped = Probabilities(model.net).eval()
    inputs, dims = example_inputs(datamodule)
    program = torch.export.export(wrapped, (inputs,), dynamic_shapes={"inputs": dims})
    class_names = list(model.class_names)
    description = {"dtype": str(inputs.dtype).removeprefix("torch."), "shape": list(inputs.shape), "varies": list(dims)}
{%- if cookiecutter.task == "sequence" %}
    description["vocab_size"] = datamodule.vocab_size  # token ids lie in [0, vocab_size)
{%- endif %}
    extra_files = {CLASS_NAMES_FILE: json.dumps(class_names), INPUT_FILE: json.dumps(description)}
    try:
        with written_whole(output) as temporary:
            torch.export.save(program, temporary, extra_files=extra_files)
        if len(targets) > 1:
            onnx_program = torch.onnx.export(
                wrapped, (inputs,), dynamic_shapes={"inputs": dims}, input_names=["inputs"], dynamo=True
            )
            onnx_program.model.metadata_props["class_names"] = json.dumps(class_names)
            with written_whole(targets[1]) as temporary:
                onnx_program.save(temporary)
    except OSError as err:  # a full disk, a folder made read-only since the check
        raise UserError(f"--output {err.filename or output} could not be written ({err.strerror or err})") from err
    return targets


def check_outputs(output: str | Path, overwrite: bool, onnx: str) -> list[Path]:
    """The files ``export`` writes for ``--output`` (as given), each checked: a file can be written there."""
    path = Path(output)
    targets = [path] + ([path.with_suffix(".onnx")] if onnx == "yes" or (onnx == "auto" and _has_onnx()) else [])
    for target in targets:
        shown = output if target == path else target  # as given: "model.pt2/" names a folder
        check_output_file(shown, "--output", overwrite=overwrite, overwrite_flag="--overwrite")
    return targets


def _has_onnx() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript"))


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Other arguments (--config, --data.*) go to train.py."
    )
    parser.add_argument("--ckpt_path", required=True, help="the checkpoint, or `last` for the newest run's")
    parser.add_argument("--output", help="the .pt2 file to write (default: model.pt2 in the checkpoint's run folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace files that exist")
    parser.add_argument(
        "--onnx", choices=("auto", "yes", "no"), default="auto", help="also write .onnx (auto: when installed)"
    )
    known, rest = parser.parse_known_args(args)
    try:
        last = known.ckpt_path == "last"
        ckpt_path = latest_checkpoint(Path("runs/lightning_logs")) if last else Path(known.ckpt_path)
        output = Path(known.output) if known.output else ckpt_path.parent.parent / "model.pt2"
        if output.suffix != ".pt2":
            raise ConfigError(f"--output {output} must end in .pt2 (the .onnx file is written beside it)")
        check_outputs(known.output or output, known.overwrite, known.onnx)  # before the model is built
        model, datamodule = load_trained(ckpt_path, expand_shortcuts(rest))
        written = export(model, datamodule, output, overwrite=known.overwrite, onnx=known.onnx)
    except UserError as err:
        sys.exit(f"error: {err}")
    for path in written:
        print(f"exported {ckpt_path} to {path}")
    if len(written) == 1 and known.onnx == "auto":
        print("no ONNX file: pip install onnx onnxscript to have one written too")


if __name__ == "__main__":
    main()
