"""What Lightning leaves on the CPU in a batch: the tensors its move cannot reach, where they sit, why, and the fix.

The simulated GPU's strategy calls ``record`` after Lightning's move of each batch; ``left_on_cpu`` tells ``explain``
whether the CPU tensor of an operation a GPU refuses is one of them. Such a tensor is no bug by itself (CUDA takes
0-dim CPU tensors; ``pack_padded_sequence`` wants its lengths on the CPU), only the cause of a refusal.

The walk follows ``apply_to_collection`` of ``lightning_utilities`` as Lightning 2.6 calls it (a ``to`` method, a
dataclass's ``__init__`` fields, a ``Mapping``, a ``Sequence`` but ``str``); where Lightning stops, it looks into
objects' ``__dict__`` and ``__slots__`` (not ``nn.Module``s, nor properties), within ``DEPTH``, ``NODES``, ``ITEMS``.
"""

import dataclasses
import itertools
import types
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any

import torch

DEPTH, NODES, ITEMS = 6, 2000, 1000
# Why Lightning's move left a tensor where it is.
PLAIN = "plain"  # held by an object that is none of the types Lightning looks into
MOVED_BY_TO = "to"  # held by an object whose to() Lightning called, which did not move it
NOT_A_FIELD = "not a field"  # in a dataclass, but not a field its __init__ takes
MOVER = "mover"  # the user's transfer_batch_to_device moved the batch instead of Lightning

# Values that hold no tensor, nor anything to look into.
_BUILTIN_LEAVES = (str, bytes, bytearray, int, float, complex, type, range, types.ModuleType)
_LEAVES = (*_BUILTIN_LEAVES, torch.nn.Module, torch.dtype, torch.device)


@dataclasses.dataclass(frozen=True)
class Unmoved:
    """A tensor of the batch that Lightning's move left on the CPU, and why."""

    path: str  # where it sits in the batch, e.g. ``batch['extra'].values``
    tensor: torch.Tensor
    holder: type  # the class of the object that Lightning could not look into (or whose ``to`` left it)
    holder_path: str  # that object's place in the batch, e.g. ``batch['extra']``
    why: str  # PLAIN, MOVED_BY_TO, NOT_A_FIELD or MOVER
    mover: str | None = None  # the user's transfer_batch_to_device that moved the batch instead (MOVER)

    @property
    def holder_name(self) -> str:
        """The holder's class with its module: ``my_project.data.Batch``."""
        module = self.holder.__module__
        return self.holder.__qualname__ if module == "builtins" else f"{module}.{self.holder.__qualname__}"

    def cause(self) -> str:
        """Why the tensor is on the CPU, in a sentence."""
        it = f"The tensor on cpu is `{self.path}`, {tuple(self.tensor.shape)} {self.tensor.dtype}, which"
        where = "the batch" if self.holder_path == "batch" else f"`{self.holder_path}`"
        return _CAUSES[self.why].format(it=it, holder=f"{where}, a {self.holder_name}", mover=self.mover)

    def fix(self) -> str:
        """What to change, for the ``Fix:`` line."""
        return _FIXES[self.why].format(self=self, holder=self.holder_name, hook=_HOOK)


_CAUSES = {
    MOVER: "{it} {mover} left on the CPU: it is in {holder}, and that hook moves the batches instead of Lightning.",
    MOVED_BY_TO: "{it} stayed on the CPU: Lightning moved {holder}, by calling its to() method, which does not move "
    "this tensor.",
    NOT_A_FIELD: "{it} Lightning left on the CPU: it is in {holder}, but not a field that its __init__ takes, and "
    "Lightning moves only those of a dataclass.",
    PLAIN: "{it} Lightning left on the CPU: it is in {holder}, which Lightning cannot move. Lightning moves only "
    "tensors in lists, tuples, dicts, namedtuples and dataclasses, and objects with a .to(device) method; it hands "
    "anything else on as it is.",
}
_HOOK = (
    "or override the LightningModule's transfer_batch_to_device(self, batch, device, dataloader_idx) hook to move it"
)
_FIXES = {
    MOVER: "move `{self.path}` in {self.mover} too ({self.path}.to(device)), or give {holder} a to(self, device) "
    "method that returns it moved, and call that there",
    MOVED_BY_TO: "make {holder}.to(device) move every tensor it holds and return the moved object, {hook}",
    NOT_A_FIELD: "make it a field of {holder} that __init__ takes, give {holder} a to(self, device) method that "
    "returns it moved, {hook}",
    PLAIN: "give {holder} a to(self, device) method that returns it with its tensors moved (or make it a dataclass "
    "or a NamedTuple), {hook}",
}


_IN_FLIGHT: list[Unmoved] = []  # the batch the step now running was given


def record(moved: Any, mover: Callable[[], str | None]) -> None:
    """Keep the CPU tensors of ``moved`` that Lightning's move does not reach; where the user's hook moved it
    (``mover()``), that is why they stayed."""
    left = [spot for spot in _walk(moved) if spot.tensor.device.type == "cpu"]
    hook = mover() if left else None
    _IN_FLIGHT[:] = [dataclasses.replace(spot, why=MOVER, mover=hook) if hook else spot for spot in left]


def forget() -> None:
    _IN_FLIGHT.clear()


def left_on_cpu(tensor: torch.Tensor | None) -> Unmoved | None:
    """The tensor of the batch in flight that Lightning left on the CPU that ``tensor`` is, or views."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return None
    same = next((spot for spot in _IN_FLIGHT if spot.tensor is tensor), None)
    return same or next((spot for spot in _IN_FLIGHT if same_memory(spot.tensor, tensor)), None)


def same_memory(value: Any, tensor: torch.Tensor) -> bool:
    """Whether ``value`` is ``tensor``, or both are dense CPU tensors whose values are in the same memory."""
    return value is tensor or _address(value) == _address(tensor) != 0


def _address(value: Any) -> int:
    """Where a dense CPU tensor's values start in memory; 0 for anything else."""
    dense = isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided
    return value.untyped_storage().data_ptr() if dense else 0


def in_flight() -> list[Unmoved]:
    """The tensors of the batch in flight that Lightning left on the CPU, 0-dim ones (which CUDA takes) aside."""
    return [spot for spot in _IN_FLIGHT if spot.tensor.dim() > 0]


def _walk(batch: Any) -> list[Unmoved]:
    """Every tensor of ``batch`` that Lightning's move does not reach, with why, within the bounds."""
    seen: dict[int, Any] = {}  # by id, holding each object, so that no id is another's while walking
    budget = NODES

    def walk(value: Any, path: str, depth: int, left: tuple[type, str, str] | None) -> Iterator[Unmoved]:
        if isinstance(value, torch.Tensor):
            if left is not None:
                yield Unmoved(path, value, *left)
            return
        nonlocal budget
        if value is None or isinstance(value, _LEAVES) or depth > DEPTH or budget <= 0 or id(value) in seen:
            return
        budget -= 1
        seen[id(value)] = value
        kind = type(value)
        if left is not None:  # inside what Lightning hands on as it is: everything in it stays
            for where, item in _parts(value, path):
                yield from walk(item, where, depth + 1, left)
        elif callable(getattr(kind, "to", None)):  # Lightning calls its to(): what that leaves stays
            for where, item, _ in _named_attributes(value, path):
                yield from walk(item, where, depth + 1, (kind, path, MOVED_BY_TO))
        elif dataclasses.is_dataclass(value):
            fields = {field.name for field in dataclasses.fields(value) if field.init}
            for where, item, name in _named_attributes(value, path):
                yield from walk(item, where, depth + 1, None if name in fields else (kind, path, NOT_A_FIELD))
        elif isinstance(value, Mapping | Sequence):  # dicts, tuples, namedtuples, lists (str is a leaf)
            for where, item in _parts(value, path):
                yield from walk(item, where, depth + 1, None)
        else:
            for where, item, _ in _named_attributes(value, path):
                yield from walk(item, where, depth + 1, (kind, path, PLAIN))

    found: list[Unmoved] = []
    try:
        for spot in walk(batch, "batch", 0, None):
            found.append(spot)
    except Exception:  # the batch's own code raised (an items(), a __getattr__): the look ends, the run goes on
        pass
    finally:
        # ``walk`` refers to itself, a cycle only the collector frees: what it saw goes now, out of the memory count.
        seen.clear()
    return found


def _parts(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """What ``value`` holds, with its place."""
    if isinstance(value, Mapping):
        for key, item in itertools.islice(value.items(), ITEMS):
            shown = repr(key) if isinstance(key, str | int | float) else f"<{type(key).__name__}>"
            yield f"{path}[{shown}]", item
    elif isinstance(value, Sequence):
        fields = getattr(value, "_fields", None) if isinstance(value, tuple) else None  # a namedtuple's names
        for index, item in enumerate(itertools.islice(value, ITEMS)):
            yield (f"{path}.{fields[index]}" if fields and index < len(fields) else f"{path}[{index}]"), item
    elif isinstance(value, Set):
        for item in itertools.islice(value, ITEMS):
            yield f"{path}{{...}}", item
    else:
        for where, item, _ in _named_attributes(value, path):
            yield where, item


def _named_attributes(value: Any, path: str) -> Iterator[tuple[str, Any, str]]:
    """An object's attributes in its ``__dict__`` and ``__slots__``, read without calling anything of it."""
    try:
        attributes = object.__getattribute__(value, "__dict__")  # never a __getattr__ of the class's
    except AttributeError:
        attributes = None
    if isinstance(attributes, dict):
        for name, item in itertools.islice(attributes.items(), ITEMS):
            yield f"{path}.{name}", item, name
    for cls in type(value).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            descriptor = vars(cls).get(name)
            if name in ("__dict__", "__weakref__") or descriptor is None or not hasattr(descriptor, "__get__"):
                continue
            try:
                item = descriptor.__get__(value, cls)
            except AttributeError:  # a slot never set
                continue
            yield f"{path}.{name}", item, name
