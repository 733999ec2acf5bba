"""The exported model a server serves: its ``.pt2`` file read as data and checked before the server starts.

``torch.export.load`` unpickles parts of a ``.pt2`` file (its sample inputs with ``torch.load``, falling back to
``weights_only=False``; weights and constants marked ``use_pickle``; custom and opaque objects with
``pickle.loads``), and its graph names the functions it calls. So a file is loaded only when it holds nothing but
what ``torch.export.save`` writes for a plain program (``archive``, which reads it within bounds), every
``torch.load`` is forced to ``weights_only`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``), and its graph calls only ATen
operations and ``operator.getitem``. What its extra files claim is checked against the program's own signature and
output (a model of tensors' in ``tensor_claims``). Tested with PyTorch 2.14 (``torch.export.pt2_archive``).
"""

import io
import json
import logging
import logging.handlers
import operator
import os
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch.export import ExportedProgram

from ..errors import first_line
from ..files import NotAFileError, open_regular
from ..model_format import (
    CLASS_NAMES_FILE,
    EXPORT_COMMAND,
    IMAGES,
    INPUT_FILE,
    TENSORS,
    TOKENS,
    TensorInput,
    constant_size,
    size_range,
)
from ..upstream.torch import is_aten_operation
from .archive import ModelFileError, stored_copy
from .tensor_claims import check_tensor_claims, embedding_rows

WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know of an exported model to check requests before they reach it: the fields of
    its ``kind`` (``model_format``); the other kinds' are None or empty."""

    path: Path
    class_names: tuple[str, ...]
    kind: str
    image_size: int | None = None  # images are resized to image_size x image_size
    vocab_size: int | None = None  # token ids lie in [0, vocab_size)
    lengths: tuple[int, int] | None = None  # the fewest and the most tokens the model takes
    inputs: tuple[TensorInput, ...] = ()  # a model of tensors: its inputs, in the order its program takes them
    by_keyword: bool = False  # a model of tensors: called as forward(**inputs), else forward(*inputs)
    answers: str = ""  # a model of tensors: what it answers, e.g. "a tensor (4,)" or "a dict of mean (4,), ..."
    index_rows: tuple[int | None, ...] = ()  # a model of tensors: of each input that is an embedding's ids, its rows


def read_model(path: str | Path, export_command: str = EXPORT_COMMAND) -> tuple[ExportedProgram, ModelInfo]:
    """The program in the ``.pt2`` file at ``path`` and what it takes; ``ModelFileError`` saying why not (and
    naming ``export_command``, the command that writes such files)."""
    path = Path(path)
    stored = _read_archive(path, export_command)
    extra = {CLASS_NAMES_FILE: "", INPUT_FILE: ""}
    # What torch.export logs is kept, not printed (a traceback, for a damaged file refused in one line): PyTorch's
    # loggers have handlers of their own, so those are set aside too, not only the propagation.
    logger, kept = logging.getLogger("torch.export"), logging.handlers.BufferingHandler(capacity=sys.maxsize)
    forced = os.environ.get(WEIGHTS_ONLY)
    os.environ[WEIGHTS_ONLY] = "1"  # one variable set and put back: mock.patch.dict would rewrite the whole environment
    try:
        with mock.patch.object(logger, "handlers", [kept]), mock.patch.object(logger, "propagate", False):
            program = torch.export.load(stored, extra_files=extra)
    except Exception as err:  # a damaged archive makes the deserializer raise almost any type
        # PyTorch logs what the archive reader refused and raises "check the warnings above": that is the reason.
        cause = next((record.exc_info[1] for record in kept.buffer if record.exc_info), err)
        raise ModelFileError(f"{path} cannot be loaded as an exported model ({first_line(cause)})") from err
    finally:
        stored.close()
        if forced is None:
            del os.environ[WEIGHTS_ONLY]
        else:
            os.environ[WEIGHTS_ONLY] = forced
    _check_operations(path, program)
    return program, _model_info(path, program, extra, export_command)


def _read_archive(path: Path, export_command: str) -> io.BytesIO:
    """The archive at ``path``, checked and read within bounds, as an archive of stored entries (nothing to inflate)."""
    if path.suffix != ".pt2":
        raise ModelFileError(f"{path} is not a .pt2 file: give the file {export_command} writes, or --ckpt_path")
    try:
        with open_regular(path) as file:
            return stored_copy(path, file, os.fstat(file.fileno()).st_size)
    except NotAFileError as err:
        raise ModelFileError(f"{err}: give the .pt2 file {export_command} writes") from err
    except FileNotFoundError as err:
        raise ModelFileError(f"{path} does not exist: export a checkpoint with {export_command}") from err
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as err:
        raise ModelFileError(f"{path} is not an exported model: it is not a .pt2 archive ({err})") from err
    except OSError as err:
        raise ModelFileError(f"{path} cannot be read ({err.strerror or err})") from err


def _check_operations(path: Path, program: ExportedProgram) -> None:
    """Refuse a graph that calls anything but ATen operations and ``operator.getitem``."""
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and not is_aten_operation(node.target):
            raise ModelFileError(f"{path} calls {node.target}, not a PyTorch tensor operation: refused")


def _model_info(path: Path, program: ExportedProgram, extra: dict[str, str], export_command: str) -> ModelInfo:
    """The class names and the inputs the export wrote beside the program, checked against the program; a file
    without a kind (exported before it was recorded) is read by its inputs' type and shape."""
    if not extra[CLASS_NAMES_FILE] or not extra[INPUT_FILE]:
        raise ModelFileError(
            f"{path} was not exported by {export_command}: it has no "
            f"{CLASS_NAMES_FILE} and {INPUT_FILE} beside the program"
        )
    try:
        names = json.loads(extra[CLASS_NAMES_FILE])
        if not isinstance(names, list):
            raise TypeError("not a list")
        class_names = tuple(str(name) for name in names)
        described = json.loads(extra[INPUT_FILE])
        if isinstance(described, dict) and described.get("kind") == TENSORS:
            return ModelInfo(path, (), TENSORS, **check_tensor_claims(path, program, described, class_names))
        dtype, shape = str(described["dtype"]), [int(size) for size in described["shape"]]
        kind = described.get("kind", _kind_of(dtype, shape, described))
        vocab_size = int(described["vocab_size"]) if kind == TOKENS else None
        seq_len = int(described["seq_len"]) if kind == TOKENS and "seq_len" in described else None
        image_size = int(described["image_size"]) if kind == IMAGES and "image_size" in described else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} or {CLASS_NAMES_FILE} cannot be read") from err
    takes = f"{dtype} inputs of shape {tuple(shape)}"
    if kind == IMAGES and dtype == "uint8" and len(shape) == 4 and shape[1] == 3 and shape[2] == shape[3]:
        info = ModelInfo(path, class_names, IMAGES, image_size=shape[2])
        claimed = {"image_size": image_size} if image_size is not None else {}
    elif kind == TOKENS and dtype == "int64" and len(shape) == 2:
        info = ModelInfo(path, class_names, TOKENS, vocab_size=vocab_size, lengths=_lengths(path, program, shape[1]))
        claimed = {"seq_len": seq_len} if seq_len is not None else {}
    else:
        said = f" (its {INPUT_FILE} says {kind!r})" if kind in (IMAGES, TOKENS) else ""
        raise ModelFileError(
            f"{path} takes {takes}{said}, neither images (uint8, (batch, 3, size, size)) "
            f"nor token ids (int64, (batch, length)), nor tensors its {INPUT_FILE} names: no request could be "
            "decoded for it"
        )
    _check_claims(path, program, info, dtype, shape, claimed)
    return info


def _check_claims(path: Path, program: ExportedProgram, info: ModelInfo, dtype: str, shape: list, claimed: dict):
    """Refuse what the extra files say of the inputs and classes where the program's own signature says otherwise."""
    inputs, output = _signature(path, program)
    said = f"its {INPUT_FILE} says"
    program_dtype = str(inputs.dtype).removeprefix("torch.")
    if program_dtype != dtype or len(inputs.shape) != len(shape):
        raise ModelFileError(
            f"{path}: {said} {dtype} inputs of shape {tuple(shape)}, but its program takes {program_dtype} inputs "
            f"of {len(inputs.shape)} dimensions: refused"
        )
    if constant_size(inputs.shape[0]) is not None:
        raise ModelFileError(
            f"{path}: its program takes batches of {inputs.shape[0]} inputs only (exported without a batch dimension "
            "that varies), and the server batches requests: refused"
        )
    if info.kind == IMAGES:
        side = claimed.get("image_size", info.image_size)
        sizes = [constant_size(size) for size in inputs.shape[1:]]
        if sizes != shape[1:] or side != info.image_size:
            program_shape = ", ".join("any" if size is None else str(size) for size in sizes)
            raise ModelFileError(
                f"{path}: {said} {side}x{side} images (shape {tuple(shape)}), but its program takes inputs of shape "
                f"(batch, {program_shape}): refused"
            )
    else:
        fewest, most = info.lengths
        if claimed.get("seq_len", most) != most or not 1 <= fewest <= most:
            raise ModelFileError(
                f"{path}: {said} sequences of up to {claimed['seq_len']} tokens, but its program takes from "
                f"{fewest} to {most}: refused"
            )
        rows = embedding_rows(program, program.graph_signature.user_inputs[0])
        if info.vocab_size is None or info.vocab_size < 1 or (rows is not None and info.vocab_size > rows):
            raise ModelFileError(
                f"{path}: {said} a vocabulary of {info.vocab_size} token ids, but its program embeds "
                f"{rows if rows is not None else 'no'} ids: refused"
            )
    classes = output.shape[-1] if len(output.shape) == 2 else None
    if not isinstance(classes, int) or classes != len(info.class_names):
        raise ModelFileError(
            f"{path}: its {CLASS_NAMES_FILE} names {len(info.class_names)} classes, but its program answers "
            f"{classes if isinstance(classes, int) else 'no fixed number of'} probabilities: refused"
        )
    if len(set(info.class_names)) != len(info.class_names):
        twice = next(name for name, count in Counter(info.class_names).items() if count > 1)
        raise ModelFileError(f"{path}: its {CLASS_NAMES_FILE} names the class {twice!r} twice: refused")


def _signature(path: Path, program: ExportedProgram) -> tuple[torch.Tensor, torch.Tensor]:
    """The program's one input and one output, as the (fake) tensors its graph records."""
    signature = program.graph_signature
    if len(signature.user_inputs) != 1 or len(signature.user_outputs) != 1:
        raise ModelFileError(
            f"{path}: its program takes {len(signature.user_inputs)} inputs and answers "
            f"{len(signature.user_outputs)} outputs, not one of each: refused"
        )
    (name,) = signature.user_inputs
    nodes = list(program.graph.nodes)
    (inputs,) = [node for node in nodes if node.op == "placeholder" and node.name == name]
    (output,) = [node for node in nodes if node.op == "output"]
    returned = output.args[0][0] if isinstance(output.args[0], list | tuple) else output.args[0]
    values = inputs.meta.get("val"), getattr(returned, "meta", {}).get("val")
    if not all(isinstance(value, torch.Tensor) for value in values):
        raise ModelFileError(f"{path}: its program does not record the shapes of its input and output: refused")
    return values


def _kind_of(dtype: str, shape: list[int], described: dict) -> str | None:
    """The kind of input of a file whose ``INPUT_FILE`` does not say it: by the inputs' type and shape."""
    if dtype == "uint8" and len(shape) == 4:
        return IMAGES
    if dtype == "int64" and len(shape) == 2 and "vocab_size" in described:
        return TOKENS
    return None


def _lengths(path: Path, program: ExportedProgram, exported: int) -> tuple[int, int]:
    """The fewest and the most tokens the program takes: the range its export gave the length, else ``exported``."""
    inputs, _ = _signature(path, program)
    if len(inputs.shape) != 2:
        return exported, exported  # refused by the check of the signature
    fixed = constant_size(inputs.shape[1])
    fewest, most = size_range(program, inputs.shape[1]) or (fixed, fixed)
    if most is None:
        raise ModelFileError(f"{path}: its program takes sequences of any length, with no most: refused")
    return fewest, most
