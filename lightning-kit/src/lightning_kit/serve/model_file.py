"""The exported model a server serves: its ``.pt2`` file read as data and checked before the server starts.

``torch.export.load`` unpickles parts of a ``.pt2`` file (sample inputs with ``torch.load``, falling back to
``weights_only=False``; weights and constants marked ``use_pickle``; custom objects with ``pickle.loads``), and its
graph names the functions it calls. So a file is loaded only when it holds nothing but what ``torch.export.save``
writes for a plain program (``archive``), every ``torch.load`` is forced to ``weights_only``, and its graph calls
only ATen operations and arithmetic on sizes (``SIZE_OPERATIONS``). Tested with PyTorch 2.14.

What its extra files claim is checked against the program's signature and output, for every kind alike: it takes
exactly the inputs its ``INPUT_FILE`` names, each with one batch dimension first that varies from 1 up, and answers
a tensor, a tuple, a list or a dict of tensors with that batch dimension first. The sizes that vary are the
program's own (its range constraints), whatever the file claims.
"""

import io
import json
import logging
import logging.handlers
import math
import operator
import os
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from ..errors import first_line
from ..files import NotAFileError, open_regular
from ..model_format import (
    CLASS_NAMES_FILE,
    DTYPES,
    EXPORT_COMMAND,
    IMAGES,
    INPUT_FILE,
    KEYWORD,
    POSITIONAL,
    TENSORS,
    TOKENS,
    TensorInput,
    constant_size,
    size_range,
)
from ..upstream.torch import is_aten_operation, tree_leaves, tree_unflatten
from .archive import ModelFileError, stored_copy

WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
BY = {POSITIONAL: "by position", KEYWORD: "by keyword"}
INDEX_DTYPES = ("int32", "int64")  # the dtypes an embedding takes its ids in
# What a program calls on sizes that vary (``x.view(B * T, C)``, the count of a mask's elements): arithmetic and
# comparisons of Python numbers, as torch.export's serializer writes them (torch/_export/serde/serialize.py's
# _SYM_OPS, less pow and the shifts, whose numbers a size could make huge).
SIZE_OPERATIONS = (operator.eq, operator.ne, operator.le, operator.ge, operator.lt, operator.gt, operator.neg)
SIZE_OPERATIONS += (operator.pos, operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod)
SIZE_OPERATIONS += (operator.truediv, operator.and_, operator.or_, operator.getitem, math.trunc, torch.sym_not)
SIZE_OPERATIONS += (torch.sym_int, torch.sym_float, torch.sym_ite, torch.sym_max, torch.sym_min, torch.sym_sqrt)


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know of an exported model to check requests: the fields of its ``kind``."""

    path: Path
    class_names: tuple[str, ...]
    kind: str
    image_size: int | None = None  # images are resized to image_size x image_size
    vocab_size: int | None = None  # token ids lie in [0, vocab_size)
    lengths: tuple[int, int] | None = None  # the fewest and the most tokens the model takes
    inputs: tuple[TensorInput, ...] = ()  # its inputs, in the order its program takes them
    by_keyword: bool = False  # a model of tensors: called as forward(**inputs), else forward(*inputs)
    answers: str = ""  # a model of tensors: what it answers, e.g. "a tensor (4,)" or "a dict of mean (4,), ..."
    index_rows: tuple[int | None, ...] = ()  # of each input that is an embedding's ids, the most it takes


def read_model(path: str | Path, export_command: str = EXPORT_COMMAND) -> tuple[ExportedProgram, ModelInfo]:
    """The program in the ``.pt2`` file at ``path`` and what it takes; else ``ModelFileError`` naming
    ``export_command``."""
    path = Path(path)
    stored = _read_archive(path, export_command)
    extra = {CLASS_NAMES_FILE: "", INPUT_FILE: ""}
    # What torch.export logs (a traceback, for a damaged file refused in one line) is kept, not printed: its
    # loggers have handlers of their own, so those are set aside too.
    logger, kept = logging.getLogger("torch.export"), logging.handlers.BufferingHandler(capacity=sys.maxsize)
    forced = os.environ.get(WEIGHTS_ONLY)
    os.environ[WEIGHTS_ONLY] = "1"  # set and put back: mock.patch.dict would rewrite the whole environment
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
    # ATen operations, SIZE_OPERATIONS and torch.cond, in the program's graph and in the graphs of cond's branches.
    graphs = [getattr(module, "graph", None) for module in program.graph_module.modules()]
    for node in (node for graph in graphs if isinstance(graph, torch.fx.Graph) for node in graph.nodes):
        allowed = is_aten_operation(node.target) or any(node.target is operation for operation in SIZE_OPERATIONS)
        if node.op == "call_function" and not allowed and node.target is not torch.ops.higher_order.cond:
            raise ModelFileError(f"{path} calls {node.target}, not a PyTorch tensor operation: refused")
    return program, _model_info(path, program, extra, export_command)


def _read_archive(path: Path, export_command: str) -> io.BytesIO:
    """The archive at ``path``, checked and read within bounds, its entries stored (nothing to inflate)."""
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


def _model_info(path: Path, program: ExportedProgram, extra: dict[str, str], export_command: str) -> ModelInfo:
    """What the extra files say the program takes and answers, checked against its signature and output."""
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
        kind, inputs, passed, said = _claims(path, json.loads(extra[INPUT_FILE]))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} or {CLASS_NAMES_FILE} cannot be read") from err
    if kind == TENSORS and class_names:
        raise ModelFileError(
            f"{path}: its {CLASS_NAMES_FILE} names {len(class_names)} classes, but a model of tensors answers its "
            "outputs as they are: refused"
        )
    batch, taken, inputs = _check_inputs(path, program, inputs, passed)
    outputs = _check_outputs(path, program, batch)
    if kind == TENSORS:
        rows = tuple(
            embedding_rows(program, name) if spec.dtype in INDEX_DTYPES else None
            for spec, name in zip(inputs, taken, strict=True)
        )
        return ModelInfo(
            path, (), TENSORS, inputs=inputs, by_keyword=passed == KEYWORD, answers=_answers(outputs), index_rows=rows
        )
    classes = constant_size(outputs.shape[1]) if isinstance(outputs, torch.Tensor) and outputs.dim() == 2 else None
    if classes != len(class_names):
        raise ModelFileError(
            f"{path}: its {CLASS_NAMES_FILE} names {len(class_names)} classes, but its program answers "
            f"{'no fixed number of' if classes is None else classes} probabilities: refused"
        )
    if len(set(class_names)) != len(class_names):
        twice = next(name for name, count in Counter(class_names).items() if count > 1)
        raise ModelFileError(f"{path}: its {CLASS_NAMES_FILE} names the class {twice!r} twice: refused")
    claimed = f"{path}: its {INPUT_FILE} says"
    if kind == IMAGES:
        side = inputs[0].shape[-1]
        if said["image_size"] != side:
            raise ModelFileError(
                f"{claimed} {said['image_size']}x{said['image_size']} images, but its program takes {side}x{side}: "
                "refused"
            )
        return ModelInfo(path, class_names, IMAGES, image_size=side, inputs=inputs)
    fewest, most = inputs[0].range_of(0)
    if most is None or fewest < 1 or said["seq_len"] not in (None, most):
        raise ModelFileError(
            f"{claimed} sequences of up to {said['seq_len']} tokens, but its program takes from {fewest} to "
            f"{'any number' if most is None else most}: refused"
        )
    vocab_size, rows = said["vocab_size"], embedding_rows(program, taken[0])
    if vocab_size < 1 or (rows is not None and vocab_size > rows):
        raise ModelFileError(
            f"{claimed} a vocabulary of {vocab_size} token ids, but its program embeds "
            f"{rows if rows is not None else 'no'} ids: refused"
        )
    lengths = (fewest, most)
    return ModelInfo(
        path, class_names, TOKENS, vocab_size=vocab_size, lengths=lengths, inputs=inputs, index_rows=(vocab_size,)
    )


def _claims(path: Path, described: dict) -> tuple[str, tuple[TensorInput, ...], str, dict]:
    """The kind, the inputs, how they are passed and a classifier's other claims that ``INPUT_FILE`` records; a file
    exported before the kind was recorded is read by its inputs' type and shape."""
    kind = described.get("kind")
    if kind == TENSORS:
        passed, given = described.get("passed"), described.get("inputs")
        inputs = tuple(_tensor_input(path, entry) for entry in given) if isinstance(given, list) else ()
        if passed not in BY or not inputs or len({spec.name for spec in inputs}) != len(inputs):
            raise ModelFileError(
                f"{path} is damaged: its {INPUT_FILE} names no inputs of distinct names, passed {POSITIONAL} or "
                f"{KEYWORD}"
            )
        return TENSORS, inputs, passed, {}
    dtype, shape = str(described["dtype"]), [int(size) for size in described["shape"]]
    if kind in (None, IMAGES) and dtype == "uint8" and len(shape) == 4 and shape[1] == 3 and shape[2] == shape[3]:
        said = {"image_size": int(described.get("image_size", shape[3]))}
        return IMAGES, (TensorInput("image", dtype, tuple(shape[1:])),), POSITIONAL, said
    if (kind == TOKENS or (kind is None and "vocab_size" in described)) and dtype == "int64" and len(shape) == 2:
        seq_len = int(described["seq_len"]) if "seq_len" in described else None
        length = None if 1 in described.get("varies", [1]) else shape[1]
        said = {"vocab_size": int(described["vocab_size"]), "seq_len": seq_len}
        return TOKENS, (TensorInput("tokens", dtype, (length,), ((1, seq_len),)),), POSITIONAL, said
    said = f" (its {INPUT_FILE} says {kind!r})" if kind in (IMAGES, TOKENS) else ""
    raise ModelFileError(
        f"{path} takes {dtype} inputs of shape {tuple(shape)}{said}, neither images (uint8, (batch, 3, size, size)) "
        f"nor token ids (int64, (batch, length)), nor tensors its {INPUT_FILE} names: no request could be decoded "
        "for it"
    )


def _tensor_input(path: Path, entry: object) -> TensorInput:
    """One input as ``INPUT_FILE`` records it: a name, one of ``DTYPES``, a shape of sizes from 0 (or None)."""
    if not isinstance(entry, dict):
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} records an input that is not an object")
    name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
    if not isinstance(name, str) or not name:
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} records an input without a name")
    if dtype not in DTYPES:
        raise ModelFileError(f"{path}: its {INPUT_FILE} says {name} is {dtype!r}, not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(size is None or (type(size) is int and size >= 0) for size in shape):
        raise ModelFileError(f"{path} is damaged: its {INPUT_FILE} records no shape of whole sizes for {name}")
    return TensorInput(name, dtype, tuple(shape))


def _check_inputs(path: Path, program: ExportedProgram, inputs: tuple[TensorInput, ...], passed: str):
    """Refuse inputs the program does not take as claimed; else the symbol of their batch dimension, the program's
    names of them, and ``inputs`` with the program's ranges."""
    names = list(program.graph_signature.user_inputs)
    claimed = f"its {INPUT_FILE} says it takes {', '.join(map(str, inputs))} {BY[passed]}"
    try:
        args, kwargs = tree_unflatten(names, program.call_spec.in_spec)
    except Exception as err:  # a spec that does not fit its own inputs: the file was tampered with
        raise ModelFileError(f"{path}: its program does not say how it takes its inputs: refused") from err
    wanted = [spec.name for spec in inputs]
    if passed == KEYWORD:
        fits = args == () and isinstance(kwargs, dict) and sorted(kwargs) == sorted(wanted)
        taken = [kwargs.get(name) for name in wanted] if fits else []
    else:
        fits = kwargs == {} and isinstance(args, tuple) and len(args) == len(wanted)
        taken = list(args) if fits else []
    if not fits or not all(isinstance(name, str) for name in taken):
        raise ModelFileError(f"{path}: {claimed}, but its program takes {_takes(args, kwargs)}: refused")
    placeholders = {node.name: node for node in program.graph.find_nodes(op="placeholder")}
    batch, ranged = None, []
    for spec, name in zip(inputs, taken, strict=True):
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            raise ModelFileError(f"{path}: its program does not record the shape of its input {name}: refused")
        dtype, sizes = str(value.dtype).removeprefix("torch."), list(value.shape)
        # Each size after the batch's a number: a symbol compared with one would be a guard, not an answer.
        fixed = [constant_size(size) for size in sizes[1:]]
        if dtype != spec.dtype or not sizes or fixed != list(spec.shape):
            raise ModelFileError(
                f"{path}: {claimed}, but its program takes {name} of {dtype}, shape {_shape(sizes, 'batch')}: refused"
            )
        if constant_size(sizes[0]) is not None:
            raise ModelFileError(
                f"{path}: its program takes batches of {sizes[0]} examples only (exported without a batch dimension "
                "that varies), and the server batches requests: refused"
            )
        if batch is not None and sizes[0].node.expr != batch:
            raise ModelFileError(f"{path}: its program's inputs do not share one batch dimension: refused")
        batch = sizes[0].node.expr
        ranged.append(replace(spec, ranges=tuple(size_range(program, size) for size in sizes[1:])))
    fewest, most = size_range(program, sizes[0])
    if fewest > 1 or most is not None:
        raise ModelFileError(
            f"{path}: its program takes batches of {fewest} to {'any number of' if most is None else most} "
            "examples, and the server batches any number from 1: refused"
        )
    return batch, taken, tuple(ranged)


def embedding_rows(program: ExportedProgram, name: str) -> int | None:
    """The fewest rows of an embedding the program's input ``name`` indexes directly; None where it indexes none."""
    rows = []
    for node in program.graph.find_nodes(op="call_function", target=torch.ops.aten.embedding.default):
        weight, indices = node.args[:2]
        size = weight.meta.get("val").shape[0] if isinstance(weight.meta.get("val"), torch.Tensor) else None
        if getattr(indices, "name", None) == name and isinstance(size, int):
            rows.append(size)
    return min(rows, default=None)


def _check_outputs(path: Path, program: ExportedProgram, batch):
    """Refuse outputs the server cannot answer request by request; else the program's outputs (fake tensors)."""
    signature = program.graph_signature
    (output,) = program.graph.find_nodes(op="output")
    returned = [
        getattr(node, "meta", {}).get("val")
        for spec, node in zip(signature.output_specs, output.args[0], strict=False)
        if spec.kind == OutputKind.USER_OUTPUT
    ]
    try:
        outputs = tree_unflatten(returned, program.call_spec.out_spec)
    except Exception as err:  # a spec that does not fit its own outputs: the file was tampered with
        raise ModelFileError(f"{path}: its program does not say how its outputs nest: refused") from err
    wrong = _wrong_outputs(outputs, batch)
    if wrong:
        raise ModelFileError(f"{path}: its program answers {wrong}, which no request could be answered with: refused")
    return outputs


def _wrong_outputs(outputs, batch) -> str:
    """What is wrong with a program's outputs (fake tensors, nested as it returns them); empty where nothing is."""
    if isinstance(outputs, torch.Tensor):
        first = outputs.shape[0] if outputs.dim() else None
        if not isinstance(first, torch.SymInt) or first.node.expr != batch or outputs.is_complex():
            return f"a {str(outputs.dtype).removeprefix('torch.')} tensor of shape {_shape(outputs.shape, 'batch')}"
        return ""
    if type(outputs) is dict and all(isinstance(key, str) for key in outputs):
        items = list(outputs.values())
    elif type(outputs) in (tuple, list):
        items = list(outputs)
    else:
        return f"a {type(outputs).__name__}"
    return next((wrong for wrong in (_wrong_outputs(item, batch) for item in items) if wrong), "" if items else "()")


def _answers(outputs) -> str:
    """``a tensor (4,)``; ``a dict of mean (4,), scale ()``; ``a tuple of (4,), (any, 3)``: per example."""
    if isinstance(outputs, torch.Tensor):
        return f"a tensor {_shape(outputs.shape[1:])}"
    if isinstance(outputs, dict):
        return "a dict of " + ", ".join(
            f"{key} {_answers(value).removeprefix('a tensor ')}" for key, value in outputs.items()
        )
    return f"a {type(outputs).__name__} of " + ", ".join(_answers(value).removeprefix("a tensor ") for value in outputs)


def _takes(args, kwargs) -> str:
    """How a program takes its inputs, as a message says it: ``history by keyword``, ``x, y by position``."""
    ways = [f"{', '.join(map(str, tree_leaves(args)))} by position"] if args else []
    ways += [f"{', '.join(map(str, kwargs))} by keyword"] if kwargs else []
    return " and ".join(ways) or "no inputs"


def _shape(sizes, first: str = "any") -> str:
    """A program's shape, ``(batch, 3)``: its sizes that vary shown as ``first`` (the first) or ``any``."""
    fixed = map(constant_size, sizes)
    shown = [str(size) if size is not None else first if axis == 0 else "any" for axis, size in enumerate(fixed)]
    return f"({', '.join(shown)}{',' if len(shown) == 1 else ''})"
