"""What a model's forward takes, found for its export: an example of its inputs, checked by calling forward, and
what the exported file records of them (``model_format.INPUT_FILE``).

The inputs are the first of these that applies (the README's ``export``): the model's ``example_input_array``
(``TENSORS``); the data module's ``image_size`` (``IMAGES``) or ``seq_len`` and ``vocab_size`` (``TOKENS``), a
classifier; one batch of the data module's first loader of ``LOADERS``, made what forward takes (``TENSORS``). A
model of tensors takes each input with one ``torch.export.Dim`` batch dimension first, and each other dimension
free wherever forward lets it vary (``Dim.AUTO``). The example is cut or repeated to ``EXAMPLE_ROWS`` rows, as
torch.export makes a batch dimension of 0 or 1 a constant.
"""

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.utils.data import DataLoader

from .errors import ConfigError, first_line
from .model_format import DTYPES, IMAGES, KEYWORD, POSITIONAL, TENSORS, TOKENS, TensorInput

EXAMPLE_ROWS = 2
FEWEST_TOKENS = 2  # the fewest tokens an exported sequence model takes, for the same reason
# The data module's loaders, in the order a batch is taken from them, and the stage ``setup`` is called for.
LOADERS = (("predict", "predict_dataloader"), ("test", "test_dataloader"), ("validate", "val_dataloader"))
LOADERS += (("fit", "train_dataloader"),)


@dataclass(frozen=True)
class Example:
    """``network(*args, **kwargs)``, which answered ``outputs``; ``dynamic_shapes`` as ``torch.export`` takes it."""

    network: nn.Module
    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]
    dynamic_shapes: tuple | dict
    described: dict  # what the file records of its inputs (INPUT_FILE)
    outputs: Any  # what the network answered for the example
    named: str  # the model, as messages name it: "Forecaster"
    input_names: list[str] = field(default_factory=list)  # of the flat inputs, in order
    batch: tuple | None = None  # the batch of the data the example was cut from: (args, kwargs, whence), or None
    given: tuple | None = None  # the example_input_array, as given (not cut to EXAMPLE_ROWS): (args, kwargs, whence)

    kind = property(lambda self: self.described["kind"])


def example_inputs(model: nn.Module, datamodule: Any) -> Example:
    """An example of what ``model``'s forward takes, checked by calling it; else ``ConfigError``."""
    named = type(model).__name__
    given = getattr(model, "example_input_array", None)
    if given is not None:
        source = f"the example_input_array of {named}"
        if isinstance(given, torch.Tensor):
            given = (given,)
        if not isinstance(given, tuple | list | Mapping):
            raise ConfigError(
                f"{source} is a {type(given).__name__}: set it to what forward takes, a tensor, a tuple (positional "
                "arguments) or a dict (keyword arguments) of tensors"
            )
        args, kwargs = ((), dict(given)) if isinstance(given, Mapping) else (tuple(given), {})
        example, why = _tensors(model, named, args, kwargs, source)
        if example is None:
            raise ConfigError(f"{why}: set example_input_array on {named} to what its forward takes")
        return replace(example, given=(args, kwargs, source))
    classified = _classifier_inputs(model, named, datamodule)
    if classified is not None:
        return classified
    args, kwargs, where = _batch_call(model, datamodule)
    why = where
    if args is not None:
        example, why = _tensors(model, named, args, kwargs, where)
        if example is not None:
            return replace(example, batch=(args, kwargs, where))
    raise ConfigError(
        f"the export cannot tell what {named} takes ({why}): set example_input_array on {named} to "
        "what its forward takes (a tensor, a tuple or a dict of tensors), or give the data module image_size, or "
        "seq_len and vocab_size"
    )


def _classifier_inputs(net: nn.Module, named: str, datamodule: Any) -> Example | None:
    """Images of the data module's ``image_size``, or token ids up to its ``seq_len``; None where it has neither."""
    batch = torch.export.Dim("batch")
    size = getattr(datamodule, "image_size", None)
    seq_len, vocab_size = getattr(datamodule, "seq_len", None), getattr(datamodule, "vocab_size", None)
    if size is not None:
        inputs = torch.zeros(EXAMPLE_ROWS, 3, size, size, dtype=torch.uint8)
        dims = {0: batch}
        described = {"kind": IMAGES, "image_size": int(size)}
        takes = f"uint8 images of {size}x{size} (the data module's image_size)"
    elif seq_len is not None and vocab_size is not None:
        inputs = torch.zeros(EXAMPLE_ROWS, seq_len, dtype=torch.long)
        dims = {0: batch, 1: torch.export.Dim("length", min=FEWEST_TOKENS, max=seq_len)}
        described = {"kind": TOKENS, "seq_len": int(seq_len), "vocab_size": int(vocab_size)}
        takes = f"int64 token ids, {seq_len} of them (the data module's seq_len)"
    else:
        return None
    outputs = _called(net, (inputs,), {}, f"{named} cannot take {takes}")
    if not isinstance(outputs, torch.Tensor) or outputs.dim() != 2 or outputs.shape[0] != EXAMPLE_ROWS:
        shape = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ConfigError(
            f"{named} answers {shape} for {EXAMPLE_ROWS} {takes}: a classifier answers logits of (batch, classes)"
        )
    described |= {"dtype": str(inputs.dtype).removeprefix("torch."), "shape": list(inputs.shape), "varies": list(dims)}
    return Example(net, (inputs,), {}, (dims,), described, outputs, named, ["inputs"])


def _called(net: nn.Module, args: tuple, kwargs: dict, failed: str) -> Any:
    """``net(*args, **kwargs)`` in eval mode without gradients; ``ConfigError`` saying ``failed`` and why."""
    try:
        with torch.no_grad():
            return net.eval()(*args, **kwargs)
    except Exception as err:  # the user's forward: any error is theirs to read, in one line
        raise ConfigError(f"{failed}: its forward raised {first_line(err, typed=True)}") from err


def _tensors(net: nn.Module, named: str, args: tuple, kwargs: dict, source: str) -> tuple[Example | None, str]:
    """A model of ``TENSORS`` on ``args`` and ``kwargs`` (from ``source``), checked by calling it; else None, why."""
    given = [*args, *kwargs.values()]
    odd = [value for value in given if not isinstance(value, torch.Tensor)]
    if not given or odd:
        what = f"a {type(odd[0]).__name__}" if odd else "no inputs"
        return None, f"{source} holds {what}, not tensors alone"
    dtypes = [str(value.dtype).removeprefix("torch.") for value in given]
    if unsupported := [dtype for dtype in dtypes if dtype not in DTYPES]:
        return None, f"{source} holds a {unsupported[0]} tensor, which JSON cannot give: inputs of {', '.join(DTYPES)}"
    rows = {value.shape[0] if value.dim() else None for value in given}
    if None in rows or len(rows) != 1 or 0 in rows:
        shapes = ", ".join(str(tuple(value.shape)) for value in given)
        wrong = "no rows" if rows == {0} else "not all of one batch dimension first"
        return None, f"{source} holds tensors of shapes {shapes}, {wrong}"
    args = tuple(_rows(value) for value in args)
    kwargs = {name: _rows(value) for name, value in kwargs.items()}
    try:
        outputs = _called(net, args, kwargs, f"{named} cannot take {source}")
    except ConfigError as err:
        return None, str(err)
    if (kept := _named_tuple(outputs)) is not None:  # whatever the example: the answer is what cannot be exported
        raise ConfigError(
            f"{named}'s forward answers a NamedTuple, {kept}, whose class torch.export cannot save: answer a dict of "
            "its fields (._asdict()) or a tuple"
        )
    if wrong := wrong_output(outputs, EXAMPLE_ROWS):
        return None, f"for {source}, {named}'s forward answers {wrong}"
    names = _positional_names(net, len(args)) + list(kwargs)
    described = {
        "kind": TENSORS,
        "passed": KEYWORD if kwargs else POSITIONAL,
        "inputs": [
            TensorInput(name, dtype, tuple(value.shape[1:])).described()
            for name, dtype, value in zip(names, dtypes, [*args, *kwargs.values()], strict=True)
        ],
    }
    return Example(net, args, kwargs, free_axes(args, kwargs), described, outputs, named, names), ""


def free_axes(args: tuple, kwargs: dict, others: Any = torch.export.Dim.AUTO) -> tuple | dict:
    """``dynamic_shapes`` for ``torch.export``: a batch dimension shared by every input, and each other axis
    ``others`` (``Dim.AUTO``: free wherever forward lets it vary; ``None``: the example's size)."""
    batch = torch.export.Dim("batch")

    def axes(value: torch.Tensor) -> dict:
        return {axis: batch if axis == 0 else others for axis in range(value.dim()) if axis == 0 or others is not None}

    return {name: axes(value) for name, value in kwargs.items()} if kwargs else tuple(axes(value) for value in args)


def real_batch(model: nn.Module, datamodule: Any) -> tuple[tuple, dict, str] | None:
    """A batch of the data as the model's forward takes it, unchanged, and whence it came; or None."""
    args, kwargs, where = _batch_call(model, datamodule)
    if args is None or not all(isinstance(value, torch.Tensor) for value in [*args, *kwargs.values()]):
        return None
    return args, kwargs, where


def _rows(value: torch.Tensor) -> torch.Tensor:
    """``value`` cut or repeated to ``EXAMPLE_ROWS`` rows, contiguous (not a view of a larger batch)."""
    index = torch.arange(EXAMPLE_ROWS, device=value.device) % value.shape[0]
    return value.index_select(0, index).contiguous()


def wrong_output(outputs: Any, rows: int) -> str:
    """Why a server cannot answer ``outputs`` for ``rows`` examples (tensors, nested in tuples, lists or dicts of
    names, each a row per example); empty where it can."""
    if isinstance(outputs, torch.Tensor):
        if outputs.dim() == 0 or outputs.shape[0] != rows:
            return f"a tensor of shape {tuple(outputs.shape)} for {rows} examples, not one row per example"
        if outputs.is_complex():
            return "a complex tensor, which JSON cannot hold"
        return ""
    if type(outputs) in (tuple, list):
        items = outputs
    elif type(outputs) is dict and all(isinstance(key, str) for key in outputs):
        items = outputs.values()
    else:
        return f"a {type(outputs).__name__}, not a tensor, a tuple or a dict (of names) of tensors"
    wrongs = (wrong_output(item, rows) for item in items)
    return next((wrong for wrong in wrongs if wrong), "" if items else "an empty container")


def _named_tuple(outputs: Any) -> str | None:
    """The class name of a NamedTuple in ``outputs`` (nested in tuples, lists or dicts), or None."""
    if isinstance(outputs, tuple) and hasattr(outputs, "_asdict"):
        return type(outputs).__name__
    items = outputs.values() if isinstance(outputs, dict) else outputs if isinstance(outputs, tuple | list) else ()
    return next(filter(None, map(_named_tuple, items)), None)


def _positional_names(net: nn.Module, count: int) -> list[str]:
    """The names of forward's first ``count`` positional parameters (``args_0``, ... for those of ``*args``)."""
    parameters = _parameters(net)
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
    rest = next((p.name for p in parameters if p.kind is p.VAR_POSITIONAL), "args")
    return names + [f"{rest}_{index}" for index in range(count - len(names))]


def _parameters(net: nn.Module) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):  # a forward whose signature cannot be read
        return []


def _batch_call(net: nn.Module, datamodule: Any) -> tuple[tuple | None, dict, str]:
    """Forward's arguments from the first batch of the data's first loader of ``LOADERS``, and whence."""
    if datamodule is None:
        return None, {}, "there is no data module"
    name = type(datamodule).__name__
    failures = []
    for stage, loader_name in LOADERS:
        loader = getattr(datamodule, loader_name, None)
        # Lightning's own loader raises: the data module has none of that stage.
        lightnings = isinstance(datamodule, L.LightningDataModule) and not is_overridden(loader_name, datamodule)
        if not callable(loader) or lightnings:
            continue
        where = f"the first batch of {name}.{loader_name}()"
        try:
            if callable(getattr(datamodule, "setup", None)):
                datamodule.setup(stage)
            loaders = loader()
            if isinstance(loaders, list | tuple) and loaders and isinstance(loaders[0], DataLoader):
                loaders = loaders[0]  # the first of several
            batch = next(iter(loaders))
        except StopIteration:
            failures.append(f"{name}.{loader_name}() is empty")
        except Exception as err:  # the user's data module: why it gave no batch, in one line
            failures.append(f"{name}.{loader_name}() gave no batch ({first_line(err, typed=True)})")
        else:
            return _call_of(batch, net, where)
    return None, {}, failures[0] if failures else f"the data module {name} has no dataloader"


def _call_of(batch: Any, net: nn.Module, where: str) -> tuple[tuple | None, dict, str]:
    """The arguments of forward that ``batch`` gives (``where`` says whence it came); else None and why not."""
    parameters = [p for p in _parameters(net) if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes = f"forward({', '.join(p.name for p in parameters)})"
    if isinstance(batch, torch.Tensor):
        return (batch,), {}, f"{where}, a tensor"
    if isinstance(batch, Mapping):
        by_name = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        kwargs = {p.name: batch[p.name] for p in by_name if p.name in batch}
        missing = [p.name for p in by_name if p.default is p.empty and p.name not in batch]
        keys = ", ".join(map(str, batch))
        if missing or not kwargs:
            lacks = f"no {', '.join(missing)}" if missing else "none of its parameters"
            return None, {}, f"{where} is a dict of {keys}, with {lacks} of {takes}"
        return (), kwargs, f"{where}, a dict of {keys}"
    if isinstance(batch, tuple | list):
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        count = sum(p.default is p.empty for p in positional) or 1
        if len(batch) < count:
            return None, {}, f"{where} holds {len(batch)} items, fewer than {takes} takes"
        return tuple(batch[:count]), {}, f"{where}, a {type(batch).__name__} of {len(batch)}"
    return None, {}, f"{where} is a {type(batch).__name__}, not a tensor, a tuple or a dict of tensors"
