"""What the file of a model of tensors claims of its inputs and outputs, checked against its program's own signature.

The program must take exactly the inputs its ``INPUT_FILE`` names (``model_format``), each with one batch dimension
first that varies from 1 example up, and answer a tensor, a tuple, a list or a dict (of names) of tensors, each with
that batch dimension first. The sizes an axis that varies takes are the program's own (its range constraints),
whatever the file claims; an integer input that indexes an embedding takes ids below its rows. The ``call_spec``
is read with PyTorch's private pytree functions (``upstream.torch``).
"""

from pathlib import Path

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from ..model_format import (
    CLASS_NAMES_FILE,
    DTYPES,
    INPUT_FILE,
    KEYWORD,
    POSITIONAL,
    TensorInput,
    constant_size,
    size_range,
)
from ..upstream.torch import tree_leaves, tree_unflatten
from .archive import ModelFileError

# How a message says the inputs are passed.
BY = {POSITIONAL: "by position", KEYWORD: "by keyword"}
# The dtypes an embedding takes its ids in.
INDEX_DTYPES = ("int32", "int64")


def check_tensor_claims(path: Path, program: ExportedProgram, described: dict, class_names: tuple[str, ...]) -> dict:
    """The ``ModelInfo`` fields of a model of tensors: what ``described`` (its ``INPUT_FILE``) says, checked against
    the program; else ``ModelFileError``."""
    passed, given = described.get("passed"), described.get("inputs")
    inputs = tuple(_tensor_input(path, entry) for entry in given) if isinstance(given, list) else ()
    if passed not in (POSITIONAL, KEYWORD) or not inputs or len({spec.name for spec in inputs}) != len(inputs):
        raise ModelFileError(
            f"{path} is damaged: its {INPUT_FILE} names no inputs of distinct names, passed {POSITIONAL} or {KEYWORD}"
        )
    if class_names:
        raise ModelFileError(
            f"{path}: its {CLASS_NAMES_FILE} names {len(class_names)} classes, but a model of tensors answers its "
            "outputs as they are: refused"
        )
    batch, taken, inputs = _check_inputs(path, program, inputs, passed)
    rows = tuple(
        embedding_rows(program, name) if spec.dtype in INDEX_DTYPES else None
        for spec, name in zip(inputs, taken, strict=True)
    )
    answers = _check_outputs(path, program, batch)
    return {"inputs": inputs, "by_keyword": passed == KEYWORD, "answers": answers, "index_rows": rows}


def _tensor_input(path: Path, entry: object) -> TensorInput:
    """One input as ``INPUT_FILE`` records it: a name, one of ``DTYPES``, a shape of sizes from 0 (the ranges of
    the sizes that vary are the program's: ``_check_inputs``)."""
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
    """Refuse inputs the program does not take as ``INPUT_FILE`` says; else the symbol of their batch dimension,
    the program's names of them, and ``inputs`` with the program's ranges."""
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
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
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
                f"{path}: {claimed}, but its program takes {spec.name} of {dtype}, shape {_shown(sizes)}: refused"
            )
        if constant_size(sizes[0]) is not None:
            raise ModelFileError(
                f"{path}: its program takes batches of {sizes[0]} examples only (exported without a batch dimension "
                "that varies), and the server batches requests: refused"
            )
        if batch is not None and sizes[0].node.expr != batch:
            raise ModelFileError(f"{path}: its program's inputs do not share one batch dimension: refused")
        batch = sizes[0].node.expr
        ranged.append(
            TensorInput(spec.name, spec.dtype, spec.shape, tuple(size_range(program, size) for size in sizes[1:]))
        )
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
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            weight, indices = node.args[0], node.args[1]
            size = weight.meta.get("val").shape[0] if isinstance(weight.meta.get("val"), torch.Tensor) else None
            if getattr(indices, "name", None) == name and isinstance(size, int):
                rows.append(size)
    return min(rows, default=None)


def _check_outputs(path: Path, program: ExportedProgram, batch) -> str:
    """Refuse outputs the server cannot answer request by request (the module's docstring); else what the program
    answers, described."""
    signature = program.graph_signature
    (output,) = [node for node in program.graph.nodes if node.op == "output"]
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
    return _answers(outputs)


def _wrong_outputs(outputs, batch) -> str:
    """What is wrong with a program's outputs (fake tensors, nested as it returns them); empty where nothing is."""
    if isinstance(outputs, torch.Tensor):
        first = outputs.shape[0] if outputs.dim() else None
        if not isinstance(first, torch.SymInt) or first.node.expr != batch or outputs.is_complex():
            return f"a {str(outputs.dtype).removeprefix('torch.')} tensor of shape {_shown(list(outputs.shape))}"
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
        sizes = [str(constant_size(size)) if constant_size(size) is not None else "any" for size in outputs.shape[1:]]
        return f"a tensor ({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"
    if isinstance(outputs, dict):
        return "a dict of " + ", ".join(
            f"{key} {_answers(value).removeprefix('a tensor ')}" for key, value in outputs.items()
        )
    return f"a {type(outputs).__name__} of " + ", ".join(_answers(value).removeprefix("a tensor ") for value in outputs)


def _takes(args, kwargs) -> str:
    """How a program takes its inputs, as a message says it: ``history by keyword``, ``x, y by position``."""
    ways = []
    if args:
        ways.append(f"{', '.join(map(str, tree_leaves(args)))} by position")
    if kwargs:
        ways.append(f"{', '.join(map(str, kwargs))} by keyword")
    return " and ".join(ways) or "no inputs"


def _shown(sizes: list) -> str:
    """A program's shape, its sizes that vary shown as ``batch`` (the first) or ``any``."""
    shown = [
        str(constant_size(size)) if constant_size(size) is not None else "batch" if axis == 0 else "any"
        for axis, size in enumerate(sizes)
    ]
    return f"({', '.join(shown)}{',' if len(shown) == 1 else ''})"
