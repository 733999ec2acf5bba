"""Export a checkpoint to one self-contained file, for people and services without the project.

    python -m lightning_kit.export --model their.Module --data their.DataModule --ckpt_path runs/.../last.ckpt
    python -m my_project.export --ckpt_path last    # a project's own command line (its KitCLI)
    python -m my_project.export --ckpt_path runs/lightning_logs/version_3/checkpoints/last.ckpt --output model.pt2

writes ``model.pt2`` (``torch.export``) beside the run's checkpoints folder, and
``model.onnx`` when the ``onnx`` and ``onnxscript`` packages are installed. What the file
takes follows from the data module: with an ``image_size``, raw ``uint8`` images
``(B, 3, S, S)`` (the network normalises them inside); with a ``seq_len`` and a
``vocab_size``, token ids ``(B, T)``, ``int64``, of up to ``seq_len`` tokens. Either way it
returns class probabilities ``(B, classes)``. The class names travel in the file, and so does
what its inputs are (``input.json``: their kind and sizes), which is what a server
(``python -m lightning_kit.serve``) decodes requests by. Loading needs PyTorch alone::

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
from typing import Any

import torch
import yaml
from torch import nn

from .checkpoints import check_architecture, latest_checkpoint, read_checkpoint, written_whole
from .cli import GenericCLI, KitCLI, build, expand_shortcuts
from .errors import ConfigError, UserError, invoked_as
from .files import check_output_file
from .model_format import CLASS_NAMES_FILE, IMAGES, INPUT_FILE, TOKENS
from .trust import check_trusted, read_config, trust_modules

# What of a run's config.yaml builds its model and data.
RUN_SETTINGS = ("seed_everything", "model", "data")
# The fewest tokens an exported sequence model takes: torch.export makes a dimension of 0 or 1 a constant.
FEWEST_TOKENS = 2


class Probabilities(nn.Module):
    """What an exported file holds: the trained network, then a softmax over its logits."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs).softmax(dim=-1)


def example_inputs(datamodule) -> tuple[torch.Tensor, dict[int, torch.export.Dim], dict[str, Any]]:
    """Inputs of the shape and type the network takes, which of their dimensions may vary, and what a server
    needs to know of them (written as ``INPUT_FILE``): images when the data module has an ``image_size``, token
    ids when it has a ``seq_len`` and a ``vocab_size``."""
    batch = {0: torch.export.Dim("batch")}
    size = getattr(datamodule, "image_size", None)
    if size is not None:
        inputs = torch.zeros(2, 3, size, size, dtype=torch.uint8)
        return inputs, batch, {"kind": IMAGES, "image_size": int(size)}
    seq_len, vocab_size = getattr(datamodule, "seq_len", None), getattr(datamodule, "vocab_size", None)
    if seq_len is not None and vocab_size is not None:
        length = torch.export.Dim("length", min=FEWEST_TOKENS, max=seq_len)
        inputs = torch.zeros(2, seq_len, dtype=torch.long)
        return inputs, {**batch, 1: length}, {"kind": TOKENS, "seq_len": int(seq_len), "vocab_size": int(vocab_size)}
    raise ConfigError(
        f"the data module {type(datamodule).__name__} has neither an image_size nor a seq_len and a vocab_size: "
        "the export cannot tell what the network takes (uint8 images of image_size, or token ids up to seq_len)"
    )


def load_trained(ckpt_path: Path, args: list[str], cli_class: type[KitCLI] = GenericCLI) -> tuple[nn.Module, object]:
    """The model of ``ckpt_path`` with its weights, and its data module, built by ``cli_class`` from its run's
    ``config.yaml`` and ``args``."""
    config = ckpt_path.parent.parent / "config.yaml"
    given = any(arg in ("-c", "--config") or arg.startswith("--config=") for arg in args)
    if not given and not config.is_file():
        raise ConfigError(f"no config.yaml in {config.parent}: give the run's settings with --config")
    own = cli_class.own_package()
    # Before the run's files are read: the project's package and the modules it trusts may be named in them.
    trust_modules((*([own] if own else []), *cli_class.trusted_modules))
    trained = read_checkpoint(ckpt_path, args)
    settings = []
    if not given:
        # The run's settings, without those of `fit` itself (ckpt_path, ...), which building the model does not take.
        run = read_config(config) or {}
        check_trusted(run, config, args, [config.parent])  # read as data: built only from code it may import
        settings = ["--config", yaml.safe_dump({key: run[key] for key in RUN_SETTINGS if key in run})]
    model, datamodule = build(cli_class, [*settings, *args])
    check_architecture(ckpt_path, trained, model)
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), datamodule


def export(model, datamodule, output: Path, overwrite: bool = False, onnx: str = "auto") -> list[Path]:
    """Write ``output`` (``.pt2``), and its ``.onnx`` sibling as ``onnx`` says; return the files written.

    The network is the model's ``net`` where it has one, else the model itself. Each file is written
    beside its name and renamed into place: a link at that name is replaced, not written through.
    """
    targets = check_outputs(output, overwrite, onnx)
    if onnx == "yes" and not _has_onnx():
        raise ConfigError("--onnx yes needs the onnx and onnxscript packages: pip install onnx onnxscript")
    net = model.net if isinstance(getattr(model, "net", None), nn.Module) else model
    wrapped = Probabilities(net).eval()
    inputs, dims, description = example_inputs(datamodule)
    program = torch.export.export(wrapped, (inputs,), dynamic_shapes={"inputs": dims})
    class_names = _class_names(model, datamodule, program, inputs)
    dtype = str(inputs.dtype).removeprefix("torch.")
    description |= {"dtype": dtype, "shape": list(inputs.shape), "varies": list(dims)}
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


def _class_names(model, datamodule, program, inputs: torch.Tensor) -> list[str]:
    """The model's class names, else the data module's, else the classes' numbers ("0", "1", ...)."""
    for owner in (model, datamodule):
        names = getattr(owner, "class_names", None)
        if names is not None:
            return [str(name) for name in names]
    with torch.no_grad():
        return [str(index) for index in range(program.module()(inputs).shape[-1])]


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


def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Export the checkpoint that ``args`` name, its model and data built by ``cli_class`` (the project's
    ``KitCLI``; by default ``GenericCLI``, which takes ``--model`` and ``--data``); ``prog`` names the command in
    messages."""
    parser = argparse.ArgumentParser(
        prog=prog or invoked_as("python -m lightning_kit.export"),
        description=__doc__.split("\n\n")[0],
        epilog=f"Other arguments (--config, --model, --data.*) go to {cli_class.command}, as for fit.",
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
        model, datamodule = load_trained(ckpt_path, expand_shortcuts(rest), cli_class)
        written = export(model, datamodule, output, overwrite=known.overwrite, onnx=known.onnx)
    except UserError as err:
        sys.exit(f"error: {err}")
    for path in written:
        print(f"exported {ckpt_path} to {path}")
    if len(written) == 1 and known.onnx == "auto":
        print("no ONNX file: pip install onnx onnxscript to have one written too")


if __name__ == "__main__":
    main()
