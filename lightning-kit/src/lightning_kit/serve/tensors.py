"""A model's inputs and answers: one example's JSON decoded and checked against what its file records, a batch made
the program's arguments, and its outputs made each request's answer. NumPy and PyTorch alone (no LitServe)."""

import json

import numpy as np
import torch

from ..model_format import TensorInput
from ..upstream.torch import tree_flatten, tree_unflatten
from .model_file import ModelInfo

JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}


class RequestError(ValueError):
    """A request the model cannot take: why (the message), answered with ``status``."""

    status = 400


def accepted(model: ModelInfo) -> str:
    """What ``POST /predict`` takes as JSON for ``model``, as its messages say it."""
    entries = ", ".join(f'"{spec.name}": {expected(spec)}' for spec in model.inputs)
    return f"JSON {{{entries}}} for one example (Content-Type application/json)"


def expected(spec: TensorInput) -> str:
    """What one example of ``spec`` is: ``24x2 nested lists of float32``, ``a list of 4 int64``, ``true or false``."""
    if not spec.shape:
        return "true or false" if spec.dtype == "bool" else f"one {spec.dtype} number"
    if len(spec.shape) == 1:
        return f"a list of {spec.size_said(0)} {spec.dtype}"
    return f"{str(spec).partition(', ')[2].removesuffix(')')} nested lists of {spec.dtype}"


def decode(body: bytes, model: ModelInfo) -> dict[str, np.ndarray]:
    """The inputs of one example from a JSON body, each checked against its dtype and shape; else ``RequestError``."""
    shown = accepted(model)
    try:
        given = json.loads(body, parse_constant=_not_a_number)
    except RecursionError as err:
        raise RequestError(f"the body nests too deeply to be read: send {shown}") from err
    except ValueError as err:  # malformed JSON, NaN or Infinity; UnicodeDecodeError is a ValueError
        raise RequestError(f"the body is not JSON that can be read ({err}): send {shown}") from err
    if not isinstance(given, dict):
        raise RequestError(f"the body is a JSON {type(given).__name__}, not an object: send {shown}")
    names = [spec.name for spec in model.inputs]
    missing = [name for name in names if name not in given]
    unknown = [name for name in given if name not in names]
    if missing or unknown:
        wrong = f"no {', '.join(missing)}" if missing else f"{', '.join(map(repr, unknown))}, which it does not take"
        raise RequestError(f"the body has {wrong}: the model takes {', '.join(names)}; send {shown}")
    rows = model.index_rows or (None,) * len(model.inputs)
    return {spec.name: _array(given[spec.name], spec, most) for spec, most in zip(model.inputs, rows, strict=True)}


def _not_a_number(constant: str) -> float:
    raise ValueError(f"{constant} is not a finite number")


def _array(value: object, spec: TensorInput, rows: int | None) -> np.ndarray:
    """One example of ``spec``: ``value`` walked level by level (never deeper than its shape), then its numbers (ids
    below ``rows``)."""
    items, shape = [value], []
    for depth in range(len(spec.shape)):
        fewest, most = spec.range_of(depth)
        size = len(items[0]) if type(items[0]) is list else None  # where it varies, the first list's length
        if size is not None and (size < fewest or (most is not None and size > most)):
            size = None
        flat = []
        for item in items:
            if type(item) is not list or size is None or len(item) != size:
                found = f"a list of {len(item)}" if type(item) is list else f"a {_json_type(item)}"
                where = f"at depth {depth}" if depth else "as a whole"
                wanted = (
                    "items of one length" if size is not None and fewest != most else f"{spec.size_said(depth)} items"
                )
                raise RequestError(f"{spec.name} must be {expected(spec)}: {where} it holds {found}, not {wanted}")
            flat.extend(item)
        items = flat
        shape.append(size)
    numbers = _numbers(items, spec)
    if rows is not None and numbers.size and not (numbers.min() >= 0 and numbers.max() < rows):
        outside = next(item for item in items if not 0 <= item < rows)
        raise RequestError(f"{spec.name} holds {outside}: the model's embedding of it takes ids in [0, {rows})")
    # bfloat16, which NumPy lacks, as float32 until PyTorch has them.
    return numbers.astype("float32" if spec.dtype == "bfloat16" else spec.dtype).reshape(shape)


def _numbers(items: list, spec: TensorInput) -> np.ndarray:
    """The leaves of one example, checked to be numbers of ``spec``'s dtype within its range."""
    kinds = set(map(type, items))
    if spec.dtype == "bool":
        if kinds - {bool}:
            raise RequestError(f"{spec.name} takes true or false: it holds {_first_of(items, kinds - {bool})}")
        return np.array(items, dtype=np.bool_)
    dtype = getattr(torch, spec.dtype)
    whole = not dtype.is_floating_point
    taken = {int} if whole else {int, float}
    if kinds - taken:
        what = "whole numbers" if whole else "numbers"
        raise RequestError(f"{spec.name} takes {what} ({spec.dtype}): it holds {_first_of(items, kinds - taken)}")
    bounds = torch.iinfo(dtype) if whole else torch.finfo(dtype)
    try:
        numbers = np.array(items, dtype=np.int64 if whole else np.float64)
    except OverflowError:  # a whole number past int64, or one of hundreds of digits: Python compares them
        outside = np.array([not bounds.min <= item <= bounds.max for item in items])
    else:  # JSON has no NaN (refused as it is read): a float past 1e308 is inf, outside every dtype's range
        outside = (numbers < bounds.min) | (numbers > bounds.max)
    if outside.any():
        item = items[int(np.argmax(outside))]
        shown = item if len(str(item)) <= 40 else f"a number of {len(str(item))} digits"
        if whole:
            said = f"outside the range of {spec.dtype} ({bounds.min} to {bounds.max})"
        else:
            said = f"{spec.dtype} takes finite numbers from {bounds.min:.4g} to {bounds.max:.4g}"
        raise RequestError(f"{spec.name} holds {shown}: {said}")
    return numbers


def _first_of(items: list, kinds: set) -> str:
    item = next(item for item in items if type(item) in kinds)
    return f"{json.dumps(item)[:40]} (a {_json_type(item)})"


def _json_type(item: object) -> str:
    return JSON_TYPES.get(type(item), "null" if item is None else type(item).__name__)


def arguments(examples: list[dict[str, np.ndarray]], model: ModelInfo, device) -> tuple[tuple, dict]:
    """The program's arguments for a batch of decoded examples, stacked on ``device``."""
    stacked = {
        spec.name: torch.as_tensor(np.stack([example[spec.name] for example in examples]), device=device).to(
            getattr(torch, spec.dtype)
        )
        for spec in model.inputs
    }
    if model.by_keyword:
        return (), stacked
    return tuple(stacked[spec.name] for spec in model.inputs), {}


def answers(outputs, count: int) -> list:
    """Each of ``count`` examples' share of the program's ``outputs`` (nested tensors), as JSON holds it."""
    leaves, nesting = tree_flatten(outputs)
    # A program may drop the batch dimension of a batch of one (a squeeze() torch.export traced on two examples).
    if wrong := [tuple(leaf.shape) for leaf in leaves if leaf.dim() == 0 or leaf.shape[0] != count]:
        raise ValueError(f"the model answered a tensor of shape {wrong[0]} for {count} examples, not one row each")
    rows = [_rows(leaf) for leaf in leaves]
    return [tree_unflatten([leaf[index] for leaf in rows], nesting) for index in range(count)]


def _rows(values: torch.Tensor) -> list:
    """``values`` as nested lists of Python numbers, those not finite None (JSON's null)."""
    values = values.detach().cpu()
    if not values.is_floating_point() or bool(torch.isfinite(values).all()):
        return values.tolist()
    array = values.double().numpy()  # float64, a subclass of Python's float
    return np.where(np.isfinite(array), array, None).tolist()
