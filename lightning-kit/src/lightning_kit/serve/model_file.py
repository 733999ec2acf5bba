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
from ..export import CLASS_NAMES_FILE, IMAGES, INPUT_FILE, TOKENS
from ..files import NotAFileError, open_regular

# What `torch.export.save` writes for one plain program, below the archive's own folder.
_SAVED_ENTRIES = re.compile(
    r"[^/]+/(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/[^/]+\.json"
    r"|data/weights/[^/]+|data/constants/[^/]+|data/sample_inputs/[^/]+\.pt|extra/[^/]+)"
)
_PAYLOAD_CONFIGS = re.compile(r"[^/]+/data/(weights|constants)/[^/]+_config\.json")
_TENSOR_CONSTANT = "tensor_"  # torch.export's TENSOR_CONSTANT_FILENAME_PREFIX: a tensor stored raw, not pickled
# The command that writes model files, named in messages (a project's server names its own, ``<package>.export``).
EXPORT_COMMAND = "python -m lightning_kit.export"


class ModelFileError(UserError):
    """A model file that is missing, not an exported model, unsafe to load, or of inputs no server decodes."""


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know of an exported model to check requests before they reach it.

    ``kind`` says what a request holds: ``IMAGES`` (an image file, resized to ``image_size``) or
    ``TOKENS`` (token ids in ``[0, vocab_size)``, as many as ``lengths`` allows); the other kind's
    fields are None.
    """

    path: Path
    class_names: tuple[str, ...]
    kind: str
    image_size: int | None = None  # images are resized to image_size x image_size
    vocab_size: int | None = None  # token ids lie in [0, vocab_size)
    lengths: tuple[int, int] | None = None  # the fewest and the most tokens the model takes


def read_model(path: str | Path, export_command: str = EXPORT_COMMAND) -> tuple[ExportedProgram, ModelInfo]:
    """The program in the ``.pt2`` file at ``path`` and what it takes; ``ModelFileError`` saying why not (and
    naming ``export_command``, the command that writes such files)."""
    path = Path(path)
    data = _read_bytes(path, export_command)
    _check_entries(path, data)
    extra = {CLASS_NAMES_FILE: "", INPUT_FILE: ""}
    try:
        with _weights_only_loads():
            program = torch.export.load(io.BytesIO(data), extra_files=extra)
    except Exception as err:  # a damaged archive makes the deserializer raise almost any type
        raise ModelFileError(f"{path} cannot be loaded as an exported model ({_first_line(err)})") from err
    _check_operations(path, program)
    return program, _model_info(path, program, extra, export_command)


def load_program(path: str | Path) -> ExportedProgram:
    """The program of a ``.pt2`` file that ``read_model`` has accepted (the server's workers load it again)."""
    return read_model(path)[0]


def _read_bytes(path: Path, export_command: str) -> bytes:
    if path.suffix != ".pt2":
        raise ModelFileError(f"{path} is not a .pt2 file: give the file {export_command} writes, or --ckpt_path")
    try:
        with open_regular(path) as file:
            return file.read()
    except NotAFileError as err:
        raise ModelFileError(f"{err}: give the .pt2 file {export_command} writes") from err
    except FileNotFoundError as err:
        raise ModelFileError(f"{path} does not exist: export a checkpoint with {export_command}") from err
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


def _model_info(path: Path, program: ExportedProgram, extra: dict[str, str], export_command: str) -> ModelInfo:
    """The class names and the inputs the export wrote beside the program: images or token ids.

    The kind of input is what the export recorded; a file without it (exported before it was
    recorded) is read by its inputs' type and shape.
    """
    if not extra[CLASS_NAMES_FILE] or not extra[INPUT_FILE]:
        raise ModelFileError(
            f"{path} was not exported by {export_command}: it has no "
            f"{CLASS_NAMES_FILE} and {INPUT_FILE} beside the program"
        )
    try:
        class_names = tuple(str(name) for name in json.loads(extra[CLASS_NAMES_FILE]))
        described = json.loads(extra[INPUT_FILE])
        dtype, shape = described["dtype"], [int(size) for size in described["shape"]]
        kind = described.get("kind", _kind_of(dtype, shape, described))
        vocab_size = int(described["vocab_size"]) if kind == TOKENS else None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} or {CLASS_NAMES_FILE} cannot be read") from err
    takes = f"{dtype} inputs of shape {tuple(shape)}"
    if kind == IMAGES and dtype == "uint8" and len(shape) == 4 and shape[1] == 3 and shape[2] == shape[3]:
        return ModelInfo(path, class_names, IMAGES, image_size=shape[2])
    if kind == TOKENS and dtype == "int64" and len(shape) == 2:
        return ModelInfo(path, class_names, TOKENS, vocab_size=vocab_size, lengths=_lengths(program, shape[1]))
    said = f" (its {INPUT_FILE} says {kind!r})" if kind in (IMAGES, TOKENS) else ""
    raise ModelFileError(
        f"{path} takes {takes}{said}, neither images (uint8, (batch, 3, size, size)) "
        "nor token ids (int64, (batch, length)): no request could be decoded for it"
    )


def _kind_of(dtype: str, shape: list[int], described: dict) -> str | None:
    """The kind of input of a file whose ``INPUT_FILE`` does not say it: by the inputs' type and shape."""
    if dtype == "uint8" and len(shape) == 4:
        return IMAGES
    if dtype == "int64" and len(shape) == 2 and "vocab_size" in described:
        return TOKENS
    return None


def _lengths(program: ExportedProgram, exported: int) -> tuple[int, int]:
    """The fewest and the most tokens the program takes: the range its export gave the length, else ``exported``."""
    (name,) = program.graph_signature.user_inputs
    (inputs,) = [node for node in program.graph.nodes if node.op == "placeholder" and node.name == name]
    length = inputs.meta["val"].shape[1]
    if isinstance(length, int):
        return length, length
    bounds = program.range_constraints[length.node.expr]
    return int(bounds.lower), int(bounds.upper)


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
