"""Export a checkpoint to one self-contained file, for people and services without the project.

    python -m lightning_kit.export --model their.Module --data their.DataModule --ckpt_path runs/.../last.ckpt
    python -m my_project.export --ckpt_path last    # a project's own command line (its KitCLI)
    python -m my_project.export --ckpt_path runs/lightning_logs/version_3/checkpoints/last.ckpt --output model.pt2

writes ``model.pt2`` (``torch.export`` of the model's ``forward``, what it takes in ``input.json``) beside the run's
checkpoints folder, and ``model.onnx`` when ``onnx`` and ``onnxscript`` are installed. Before a file is written, its
program is loaded back and run on a batch of the data beside forward. Loading needs PyTorch alone::

    import json, torch
    extra = {"class_names.json": "", "input.json": ""}
    model = torch.export.load("model.pt2", extra_files=extra).module()
    probabilities = model(images)                 # images or tokens
    classes = json.loads(extra["class_names.json"])
    outputs = model(history=history)              # tensors, as input.json says ("passed": "keyword")
"""

import contextlib
import importlib.util
import io
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from .building import build, expand_shortcuts
from .checkpoints import check_architecture, check_file, latest_checkpoint, read_checkpoint
from .cli import GenericCLI, KitCLI
from .command_line import CONFIG_FLAGS, CommandLine
from .errors import ConfigError, OneLineParser, UserError, command, first_line, invoked_as
from .example_inputs import Example, example_inputs, free_axes, real_batch, wrong_output
from .files import check_output_file, written_whole
from .installation import check_installation
from .model_format import CLASS_NAMES_FILE, IMAGES, INPUT_FILE, TENSORS, TOKENS, TensorInput, constant_size, size_range
from .stores import DISK_ERRORS
from .trust import check_command_line, read_run_config

__all__ = ["IMAGES", "TENSORS", "TOKENS", "Exported", "example_inputs", "export", "load_trained", "main"]

RUN_SETTINGS = ("seed_everything", "model", "data")
# What torch.export warns of every nn.RNN (GRU, LSTM), its `_flat_weights`, and of nothing else: not the user's.
RNN_WEIGHTS_WARNING = r"The tensor attributes ([\w.]+\._flat_weights\[\d+\](, )?)+ were assigned during export\."


class Probabilities(nn.Module):
    """What the file of a classifier (of images or tokens) holds: the network, then a softmax over its logits; its
    input is named ``inputs``, as the server's messages and a loaded program's signature say."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs).softmax(dim=-1)


@dataclass(frozen=True)
class Exported:
    """What ``export`` wrote, and why no ``.onnx`` where torch.onnx could not export it."""

    files: list[Path]
    no_onnx: str | None = None


def load_trained(ckpt_path: Path, args: list[str], cli_class: type[KitCLI] = GenericCLI) -> tuple[nn.Module, object]:
    """The model of ``ckpt_path`` with its weights, and its data module, built from its config.yaml and ``args``."""
    check_file(ckpt_path)  # the checkpoint named is the first thing wrong when it is not there
    config = ckpt_path.parent.parent / "config.yaml"
    given = CommandLine.of(args).gives(*CONFIG_FLAGS)
    if not given and not config.is_file():
        raise ConfigError(f"no config.yaml in {config.parent}: give the run's settings with --config")
    # Before the run's files are read: the project's package and the modules it trusts may be named in them.
    check_command_line(args, cli_class.trusted())  # and the classes it names
    trained = read_checkpoint(ckpt_path)
    settings = []
    if not given:
        # The run's settings, without those of `fit` itself (ckpt_path, ...).
        run = read_run_config(config)  # read as data: built only from code it may import
        settings = ["--config", yaml.safe_dump({key: run[key] for key in RUN_SETTINGS if key in run})]
    model, datamodule = build(cli_class, [*settings, *args])
    check_architecture(ckpt_path, trained, model)
    model.load_state_dict(torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"])
    return model.eval(), datamodule


def export(model, datamodule, output: Path, overwrite: bool = False, onnx: str = "auto") -> Exported:
    """Write ``output`` (``.pt2``), and its ``.onnx`` sibling as ``onnx`` says. What torch.export cannot export, or
    whose program answers otherwise than forward, is ``UserError``, nothing written; where torch.onnx fails, the
    ``.pt2`` is written all the same and ``Exported.no_onnx`` says why."""
    targets = check_outputs(output, overwrite, onnx)
    example = example_inputs(model, datamodule)
    classifier = example.kind in (IMAGES, TOKENS)
    network = Probabilities(example.network) if classifier else example.network
    network.eval()
    program = _exported(network, example)
    if mutated := _mutated_buffers(program):
        buffer = next(iter(mutated.values())).removeprefix("net." if classifier else "")
        raise UserError(
            f"{example.named}'s forward changes its buffer {buffer} as it answers (a counter, a cache, running "
            "statistics of a module in training mode): the exported file would answer each call otherwise than "
            "forward does, and each server process otherwise: nothing was written"
        )
    described = example.described if classifier else _described(program, example)
    class_names = _class_names(model, datamodule, example.outputs) if classifier else []
    extra_files = {CLASS_NAMES_FILE: json.dumps(class_names), INPUT_FILE: json.dumps(described)}
    # Made in memory: PyTorch's archive writer, given a file, aborts the process (SIGABRT) where a write fails.
    archive = io.BytesIO()
    torch.export.save(program, archive, extra_files=extra_files)
    _check_against_forward(archive, network, example, datamodule)
    written = targets[0]
    try:
        with written_whole(output) as temporary:
            temporary.write_bytes(archive.getbuffer())
        del archive
        written = targets[-1]
        no_onnx = _write_onnx(program, example, class_names, written) if len(targets) > 1 else None
    except OSError as err:  # a full disk, past the file size limit, a folder made read-only since the check
        cause = DISK_ERRORS.get(err.errno, "")
        raise UserError(
            f"--output: {written} could not be written ({first_line(err)}{': ' + cause if cause else ''}); "
            "nothing was left in its place"
        ) from err
    return Exported(targets if no_onnx is None else targets[:1], no_onnx)


def _exported(network: nn.Module, example: Example) -> torch.export.ExportedProgram:
    """``network`` exported with every axis forward lets vary free, else the batch alone; else ``UserError``."""
    attempts = [example.dynamic_shapes]
    if example.kind == TENSORS:
        attempts.append(free_axes(example.args, example.kwargs, others=None))
    first = None
    for dynamic_shapes in attempts:
        # torch.export prints the graph it traced, dozens of lines, where it fails: said only where it succeeds
        # (forward's own prints among it), as the failure's reason is the one line below.
        said = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(said):
                warnings.filterwarnings("ignore", message=RNN_WEIGHTS_WARNING, category=UserWarning)
                program = torch.export.export(network, example.args, example.kwargs, dynamic_shapes=dynamic_shapes)
        except Exception as err:  # the user's network, not an argument: torch.export's reason, in one line
            first = first or err
            continue
        sys.stderr.write(said.getvalue())
        return program
    raise UserError(f"torch.export cannot export {example.named} ({first_line(first, typed=True)})") from first


def _mutated_buffers(program: torch.export.ExportedProgram) -> dict[str, str]:
    """The buffers forward changes in place, by the program's outputs of them. torch.export's graph keeps in-place
    operations as they are (``aten.add_``, ``copy_`` into a view): functionalized, its signature names them."""
    try:
        return program.run_decompositions({}).graph_signature.buffers_to_mutate
    except Exception:  # a program PyTorch cannot functionalize: its check against forward remains
        return {}


def _described(program: torch.export.ExportedProgram, example: Example) -> dict:
    """``INPUT_FILE`` of a model of tensors: each input's dtype and sizes as the program takes them."""
    placeholders = {node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"}
    inputs = []
    for entry, name in zip(example.described["inputs"], program.graph_signature.user_inputs, strict=True):
        sizes = placeholders[name].shape[1:]
        shape = tuple(constant_size(size) for size in sizes)
        ranges = tuple(size_range(program, size) for size in sizes)
        inputs.append(TensorInput(entry["name"], entry["dtype"], shape, ranges).described())
    return {**example.described, "inputs": inputs}


# How close the program's floating-point outputs must be to forward's, by dtype.
_CLOSE = {torch.float16: (1e-2, 1e-3), torch.bfloat16: (5e-2, 1e-2)}
_CLOSE_DEFAULT = (1e-4, 1e-5)


def _check_against_forward(archive: io.BytesIO, network: nn.Module, example: Example, datamodule) -> None:
    """Refuse a program (loaded back) that answers a batch of the data otherwise than forward, or cannot take it;
    then the batch's last example alone, as the server answers a request alone or in a batch of any size: torch.export
    traced a batch of ``EXAMPLE_ROWS``, so a branch on a batch of 1 (or a ``squeeze()``) went the other way."""
    batch = example.batch or real_batch(example.network, datamodule) or example.given
    args, kwargs, where = batch if batch is not None else (example.args, example.kwargs, "the example")
    loaded = torch.export.load(io.BytesIO(archive.getvalue())).module()
    whole = _answered_alike(loaded, network, example, args, kwargs, where)
    leaves = [*args, *kwargs.values()]
    if any(value.dim() == 0 for value in leaves) or leaves[0].shape[0] < 2:
        return
    # The last: an example's answer may depend on the first of its batch (taken as a reference, its lengths).
    last = f"the last example of {where}"
    alone = _answered_alike(loaded, network, example, *tree_map(lambda value: value[-1:], (args, kwargs)), last)
    if differs := _differs(alone, tree_map(lambda value: value[-1:], whole)):
        raise UserError(
            f"{example.named}'s forward answers {last} alone otherwise than within that batch ({differs}): an "
            "example's answer depends on the others of its batch (batch statistics: a BatchNorm without running "
            "statistics or in training mode, a mean over the batch), and the server batches requests: nothing was "
            "written"
        )


def _answered_alike(loaded, network: nn.Module, example: Example, args: tuple, kwargs: dict, where: str):
    """Forward's answer to ``args`` and ``kwargs`` (from ``where``), one row per example, which the program answers
    too; else ``UserError``. Each is given its own copy, as forward may change its inputs in place."""
    with torch.no_grad():
        try:
            expected = network(*tree_map(torch.clone, args), **tree_map(torch.clone, kwargs))
        except Exception as err:  # the user's forward, on a batch of another size than the example's
            raise UserError(
                f"{example.named}'s forward cannot take {where} ({first_line(err, typed=True)}), and the server "
                "answers requests alone or in batches of any size: nothing was written"
            ) from err
        try:
            answered = loaded(*tree_map(torch.clone, args), **tree_map(torch.clone, kwargs))
        except Exception as err:  # a guard of the program: the data holds what the export made a constant
            raise UserError(
                f"the exported file of {example.named} cannot take {where}, which its forward takes "
                f"({first_line(err, typed=True)}): nothing was written"
            ) from err
    rows = next(value.shape[0] for value in [*args, *kwargs.values()])
    if wrong := wrong_output(expected, rows):
        raise UserError(
            f"for {where}, {example.named}'s forward answers {wrong}, and the server answers each example its row: "
            "nothing was written"
        )
    if differs := _differs(answered, expected):
        raise UserError(
            f"the exported file of {example.named} answers {where} otherwise than its forward ({differs}): nothing "
            "was written"
        )
    return expected


def _differs(answered, expected) -> str:
    """What differs between two answers, in one line (assert_close's message); empty where they are close."""
    # Looser than assert_close's own (float32: rtol 1.3e-6): the program may order forward's operations otherwise.
    # The loosest of the outputs' dtypes holds for all of them.
    tolerances = [_CLOSE.get(leaf.dtype, _CLOSE_DEFAULT) for leaf in tree_leaves(expected) if torch.is_tensor(leaf)]
    rtol, atol = max(tolerances, default=_CLOSE_DEFAULT)
    try:
        torch.testing.assert_close(answered, expected, rtol=rtol, atol=atol, equal_nan=True)
    except (AssertionError, TypeError, ValueError) as err:  # its message: what differs, and where in the outputs
        return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return ""


def _write_onnx(program: torch.export.ExportedProgram, example: Example, class_names: list[str], path: Path):
    """Write ``program`` as ONNX to ``path``, inputs named by forward's parameters; None, or why it could not."""
    classifier = example.kind in (IMAGES, TOKENS)
    # ONNX names each value once: an output named as an input is renamed.
    outputs = [f"{name}_output" if name in example.input_names else name for name in _output_names(example.outputs)]
    try:
        with warnings.catch_warnings():
            # torch.onnx warns of each dimension name shared ("batch"), needlessly.
            warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
            onnx_program = torch.onnx.export(
                program,
                input_names=example.input_names,
                output_names=None if classifier else outputs,
                dynamo=True,
                verbose=False,
            )
    except Exception as err:  # a network torch.onnx has no conversion for: the .pt2 is there all the same
        said = f"torch.onnx cannot export {example.named} ({first_line(err, typed=True)})"
        if path.is_file() and not path.is_symlink():  # --overwrite: an earlier .onnx would pass for this one's
            path.unlink()
            said += f"; the {path} of an earlier export was removed"
        return said
    if classifier:
        onnx_program.model.metadata_props["class_names"] = json.dumps(class_names)
    with written_whole(path) as temporary:
        onnx_program.save(temporary)
    return None


def _output_names(outputs, name: str | None = None) -> list[str]:
    """An ONNX file's output names, flat as torch.export flattens them: ``output``, ``output_0``, ``stats.mean``."""
    if isinstance(outputs, torch.Tensor):
        return [name or "output"]
    if isinstance(outputs, dict):
        named = [(str(key) if name is None else f"{name}.{key}", value) for key, value in outputs.items()]
    else:
        named = [(f"{name or 'output'}_{index}", value) for index, value in enumerate(outputs)]
    return [flat for key, value in named for flat in _output_names(value, key)]


def _class_names(model, datamodule, logits: torch.Tensor) -> list[str]:
    """The model's class names, else the data module's, else the classes' numbers ("0", "1", ...)."""
    for owner in (model, datamodule):
        names = getattr(owner, "class_names", None)
        if names is not None:
            return [str(name) for name in names]
    return [str(index) for index in range(logits.shape[-1])]


def check_outputs(output: str | Path, overwrite: bool, onnx: str) -> list[Path]:
    """The files ``export`` writes for ``--output``, each checked: a file can be written there, and ``--onnx yes``
    has what writes one."""
    if onnx == "yes" and not _has_onnx():
        raise ConfigError("--onnx yes needs the onnx and onnxscript packages: pip install onnx onnxscript")
    path = Path(output)
    targets = [path] + ([path.with_suffix(".onnx")] if onnx == "yes" or (onnx == "auto" and _has_onnx()) else [])
    for shown in [output, *targets[1:]]:  # as given: "model.pt2/" names a folder
        check_output_file(shown, "--output", overwrite=overwrite, overwrite_flag="--overwrite")
    return targets


def _has_onnx() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript"))


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Export the checkpoint ``args`` name, built by ``cli_class`` (the project's KitCLI); ``prog``: the command."""
    check_installation(cli_class.__module__)
    parser = OneLineParser(
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
    for path in written.files:
        print(f"exported {ckpt_path} to {path}")
    if written.no_onnx is not None:
        if known.onnx == "yes":
            sys.exit(f"error: no ONNX file: {written.no_onnx}")
        print(f"no ONNX file: {written.no_onnx}")
    elif len(written.files) == 1 and known.onnx == "auto":
        print("no ONNX file: pip install onnx onnxscript to have one written too")


if __name__ == "__main__":
    main()
