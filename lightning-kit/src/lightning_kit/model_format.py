"""What an exported model file holds beside its program, written by the export and read by the server (which imports
no Lightning: the standard library only).

``INPUT_FILE`` is JSON. For ``IMAGES`` and ``TOKENS``: ``{"kind", "dtype", "shape", "varies"}`` and ``image_size``, or
``seq_len`` and ``vocab_size``; the program answers class probabilities, named by ``CLASS_NAMES_FILE``. For
``TENSORS``: ``{"kind": "tensors", "passed": "positional" | "keyword", "inputs": [{"name", "dtype", "shape",
"ranges"}, ...]}``, each shape one example's, ``null`` for a size that varies, whose fewest and most (``null``: any)
``ranges`` gives; the program answers forward's outputs as they are, and ``CLASS_NAMES_FILE`` is an empty list.
"""

import sys
from dataclasses import dataclass

CLASS_NAMES_FILE = "class_names.json"
INPUT_FILE = "input.json"
# The kinds of input an exported file takes (``INPUT_FILE``'s "kind").
IMAGES = "images"  # uint8 (batch, 3, image_size, image_size): the data module has an image_size
TOKENS = "tokens"  # int64 (batch, length), ids in [0, vocab_size): the data module has a seq_len and a vocab_size
TENSORS = "tensors"  # named tensors of fixed dtypes and shapes, each with a batch dimension: any other network
POSITIONAL, KEYWORD = "positional", "keyword"  # INPUT_FILE's "passed": forward(*inputs), or forward(**inputs)
# The dtypes an input of a model of tensors may have: those JSON's numbers and booleans can give.
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
EXPORT_COMMAND = "python -m lightning_kit.export"


def constant_size(size: object) -> int | None:
    """An exported program's size of an axis (``int`` or ``torch.SymInt``) as a number; None where it varies."""
    if isinstance(size, int):
        return size
    expr = getattr(getattr(size, "node", None), "expr", None)
    return int(expr) if getattr(expr, "is_number", False) else None


def size_range(program: object, size: object) -> tuple[int, int | None] | None:
    """The sizes ``program`` takes along an axis of ``size``: None where fixed, else ``(fewest, most or None)``."""
    if constant_size(size) is not None:
        return None
    bounds = program.range_constraints.get(size.node.expr)
    if bounds is None:
        return 0, None
    # Not `upper.is_finite`: sympy says it of PyTorch's integer infinity too (torch.utils._sympy.numbers).
    return int(bounds.lower), None if bool(bounds.upper > sys.maxsize) else int(bounds.upper)


@dataclass(frozen=True)
class TensorInput:
    """One input of a model of tensors: forward's parameter, its dtype and one example's shape."""

    name: str
    dtype: str  # one of DTYPES
    shape: tuple[int | None, ...]  # without the batch dimension; None where the size varies
    ranges: tuple[tuple[int, int | None] | None, ...] = ()  # per axis: (fewest, most or None: any) where it varies

    def range_of(self, axis: int) -> tuple[int, int | None]:
        """The fewest and most sizes ``axis`` takes."""
        size = self.shape[axis]
        if size is not None:
            return size, size
        given = self.ranges[axis] if axis < len(self.ranges) else None
        return given if given is not None else (0, None)

    def described(self) -> dict:
        """The input as ``INPUT_FILE`` records it."""
        described = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if None in self.shape:
            described["ranges"] = [
                list(self.range_of(axis)) if size is None else None for axis, size in enumerate(self.shape)
            ]
        return described

    def __str__(self) -> str:
        """``history (float32, 24x2)``, ``audio (float32, (2 to 4096)x80)``, ``weight (float32, one number)``."""
        sizes = "x".join(map(self.size_said, range(len(self.shape)))) if self.shape else "one number"
        return f"{self.name} ({self.dtype}, {sizes})"

    def size_said(self, axis: int) -> str:
        """``24``, ``(2 to 4096)`` or ``(2 or more)``."""
        fewest, most = self.range_of(axis)
        if fewest == most:
            return str(fewest)
        return f"({fewest} to {most})" if most is not None else f"({fewest} or more)"
