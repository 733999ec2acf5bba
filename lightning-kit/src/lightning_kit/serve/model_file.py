"""The exported model a server serves: its ``.pt2`` file read as data and checked before the server starts.

``torch.export.load`` unpickles parts of a ``.pt2`` file: its sample inputs with
``torch.load`` (falling back to ``weights_only=False`` when the safe load fails), weights
and constants marked ``use_pickle`` with ``weights_only=False``, and custom and opaque
objects with ``pickle.loads``; and the graph names the functions it calls. A file from
elsewhere could run code through any of these, so a file is loaded only when

- it holds nothing but what ``torch.export.save`` writes for a plain program (no compiled
  AOTInductor libraries, no pickled weights, constants or objects: refused unread);
- every ``torch.load`` it makes is forced to ``weights_only`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``);
- its graph calls only PyTorch's tensor operations (ATen) and ``operator.getitem``.

Tested with PyTorch 2.14 (``torch.export.pt2_archive``).
"""

import io
import json
import operator
import os
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.export import ExportedProgram

from ..errors import UserError
from ..export import CLASS_NAMES_FILE, INPUT_FILE
from ..files import NotAFileError, open_regular

# What `torch.export.save` writes for one plain program, below the archive's own folder.
_SAVED_ENTRIES = re.compile(
    r"[^/]+/(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/[^/]+\.json"
    r"|data/weights/[^/]+|data/constants/[^/]+|data/sample_inputs/[^/]+\.pt|extra/[^/]+)"
)
_PAYLOAD_CONFIGS = re.compile(r"[^/]+/data/(weights|constants)/[^/]+_config\.json")
_TENSOR_CONSTANT = "tensor_"  # torch.export's TENSOR_CONSTANT_FILENAME_PREFIX: a tensor stored raw, not pickled
EXPORT_COMMAND = "python -m {{ cookiecutter.project_slug }}.export"


class ModelFileError(UserError):
    """A model file that is missing, not an exported model, unsafe to load, or of the other task."""


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know of an exported model to check requests before they reach it."""

    path: Path
    class_names: tuple[str, ...]
{%- if cookiecutter.task == "image" %}
    image_size: int  # images are resized to image_size x image_size
{%- else %}
    vocab_size: int  # token ids lie in [0, vocab_size)
    lengths: tuple[int, int]  # the fewest and the most tokens the model takes
{%- endif %}


def read_model(path: str | Path) -> tuple[ExportedProgram, ModelInfo]:
    """The program in the ``.pt2`` file at ``path`` and what it takes; ``ModelFileError`` saying why not."""
    path = Path(path)
    data = _read_bytes(path)
    _check_entries(path, data)
    extra = {CLASS_NAMES_FILE: "", INPUT_FILE: ""}
    try:
        with _weights_only_loads():
            program = torch.export.load(io.BytesIO(data), extra_files=extra)
    except Exception as err:  # a damaged archive makes the deserializer raise almost any type
        raise ModelFileError(f"{path} cannot be loaded as an exported model ({_first_line(err)})") from err
    _check_operations(path, program)
    return program, _model_info(path, program, extra)


def load_program(path: str | Path) -> ExportedProgram:
    """The program of a ``.pt2`` file that ``read_model`` has accepted (the server's workers load it again)."""
    return read_model(path)[0]


def _read_bytes(path: Path) -> bytes:
    if path.suffix != ".pt2":
        raise ModelFileError(f"{path} is not a .pt2 file: give the file {EXPORT_COMMAND} writes, or --ckpt_path")
    try:
        with open_regular(path) as file:
            return file.read()
    except NotAFileError as err:
        raise ModelFileError(f"{err}: give the .pt2 file {EXPORT_COMMAND} writes") from err
    except FileNotFoundError as err:
        raise ModelFileError(f"{path} does not exist: export a checkpoint with {EXPORT_COMMAND}") from err
    except OSError as err:
        raise ModelFileError(f"{path} cannot be read ({err.strerror or err})") from err


def _check_entries(path: Path, data: bytes) -> None:
    """Refuse, unread, an archive that holds anything but a plain program: nothing in it is unpickled."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            for name in names:
                if not _SAVED_ENTRIES.fullmatch(name):
                    raise ModelFileError(
                        f"{path} holds {name}, which a plain exported program does not: refused, nothing was loaded"
                    )
            configs = {name: archive.read(name) for name in names if _PAYLOAD_CONFIGS.fullmatch(name)}
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ModelFileError(f"{path} is not an exported model: it is not a .pt2 archive ({err})") from err
    for name, text in configs.items():
        try:
            entries = json.loads(text)["config"].values()
            pickled = [entry for entry in entries if entry["use_pickle"] or not _raw(name, entry)]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelFileError(f"{path} is damaged: {name} cannot be read ({err})") from err
        if pickled:
            raise ModelFileError(f"{path} stores objects that only unpickling can load: refused, nothing was loaded")


def _raw(config_name: str, entry: dict) -> bool:
    """Whether a weight or constant is stored as raw tensor bytes (custom and opaque objects are pickles)."""
    return "/data/weights/" in config_name or str(entry["path_name"]).startswith(_TENSOR_CONSTANT)


@contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Every ``torch.load`` inside is ``weights_only``, whatever its caller asks for."""
    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = before


def _check_operations(path: Path, program: ExportedProgram) -> None:
    """Refuse a graph that calls anything but ATen operations and ``operator.getitem``."""
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or target is operator.getitem:
            continue
        if not (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"):
            raise ModelFileError(f"{path} calls {target}, not a PyTorch tensor operation: refused")


def _model_info(path: Path, program: ExportedProgram, extra: dict[str, str]) -> ModelInfo:
    """The class names and the inputs the export wrote beside the program, checked against this project's task."""
    if not extra[CLASS_NAMES_FILE] or not extra[INPUT_FILE]:
        raise ModelFileError(
            f"{path} was not exported by {EXPORT_COMMAND}: it has no "
            f"{CLASS_NAMES_FILE} and {INPUT_FILE} beside the program"
        )
    try:
        class_names = tuple(str(name) for name in json.loads(extra[CLASS_NAMES_FILE]))
        described = json.loads(extra[INPUT_FILE])
        dtype, shape = described["dtype"], [int(size) for size in described["shape"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} or {CLASS_NAMES_FILE} cannot be read") from err
    takes = f"{dtype} inputs of shape {tuple(shape)}"
{%- if cookiecutter.task == "image" %}
    if dtype != "uint8" or len(shape) != 4 or shape[1] != 3 or shape[2] != shape[3]:
        raise ModelFileError(f"{path} takes {takes}, not images (uint8, (batch, 3, size, size)): another task's model")
    return ModelInfo(path, class_names, image_size=shape[2])
{%- else %}
    if dtype != "int64" or len(shape) != 2 or "vocab_size" not in described:
        raise ModelFileError(f"{path} takes {takes}, not token ids (int64, (batch, length)): another task's model")
    return ModelInfo(path, class_names, vocab_size=int(described["vocab_size"]), lengths=_lengths(program, shape[1]))
{%- endif %}
{%- if cookiecutter.task == "sequence" %}


def _lengths(program: ExportedProgram, exported: int) -> tuple[int, int]:
    """The fewest and the most tokens the program takes: the range its export gave the length, else ``exported``."""
    (name,) = program.graph_signature.user_inputs
    (inputs,) = [node for node in program.graph.nodes if node.op == "placeholder" and node.name == name]
    length = inputs.meta["val"].shape[1]
    if isinstance(length, int):
        return length, length
    bounds = program.range_constraints[length.node.expr]
    return int(bounds.lower), int(bounds.upper)

{%- endif %}


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
