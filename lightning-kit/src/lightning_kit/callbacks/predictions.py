"""The predictions CSV: ``predict``'s output written a row per input, renamed into place when complete."""

import contextlib
import csv
import itertools
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ..errors import UserError, first_few, first_line
from ..files import check_output_file, written_whole

# Columns of values a predictions CSV holds at most, beside the input's name and label: more is no table to read.
MAX_COLUMNS = 10_000
# Containers inside containers in predict_step's output, at most.
MAX_DEPTH = 8


class CSVPredictionWriter(BasePredictionWriter):
    """Write ``predict``'s output to a CSV file, one row per input, in the order of the inputs.

    The first column is ``file`` (the data module's ``predict_names``) or ``index``. A classifier's output
    ``(batch, classes)``, where the class names are known, is written as ``predicted``, ``label`` (where the data
    module's ``predict_labelled`` says so) and ``p_<class>``; any other output as it is (``_outputs``), then the
    labels (``_labels``). A batch for which ``predict_step`` returned None writes no row.

    The file is written beside its final name and renamed when complete, so a failed run leaves no partial file; an
    existing file is replaced only when asked to.

    Args:
        path: The CSV file to write. Under several processes, each writes its own
            file, with ``.rank<N>`` before the extension.
        overwrite: Replace ``path`` if it exists (otherwise the run stops before predicting).
            A link there is replaced by the file; what it points to is left as it is.
    """

    def __init__(self, path: str = "predictions.csv", overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.path = path
        self.overwrite = overwrite
        # Say where the predictions went; the audit, which writes them to a folder it removes, does not.
        self.announce = True
        self._writing = contextlib.ExitStack()  # the file written, closed then renamed to its name

    @staticmethod
    def check_path(path: str | Path, overwrite: bool) -> None:
        """Refuse, in one line naming the flag, a path that could not be written; the command line checks it first."""
        check_output_file(
            path, "--predictions.path", overwrite=overwrite, overwrite_flag="--predictions.overwrite true"
        )

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.path)
        if trainer.world_size > 1:
            path = path.with_suffix(f".rank{trainer.global_rank}{path.suffix}")
        self.check_path(self.path if trainer.world_size == 1 else path, self.overwrite)
        self._target, self._writer, self._rows = path, None, 0
        datamodule = trainer.datamodule
        self._names = getattr(datamodule, "predict_names", None)
        labelled = getattr(datamodule, "predict_labelled", False)
        self._labelled = False if labelled is None or labelled is False else labelled
        classes = getattr(pl_module, "class_names", None) or getattr(datamodule, "class_names", None)
        self._classes = [str(name) for name in classes] if isinstance(classes, list | tuple) and classes else None
        self._header: list[str] | None = None

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if prediction is None:
            return  # predict_step returned nothing for this batch (its own writer wrote it, say): no rows
        classes = self._classes
        if classes is not None and isinstance(prediction, torch.Tensor) and prediction.shape[1:] == (len(classes),):
            # A classifier's: its class and the class's probabilities, by name.
            size = len(prediction)
            labels = _labels(batch, size, classes, self._labelled) if self._labelled is not False else []
            header = ["predicted", *(name for name, _ in labels), *(f"p_{name}" for name in classes)]
            guesses = [classes[k] for k in prediction.argmax(dim=1).tolist()]
            scores = [[f"{p:.6f}" for p in row] for row in zip(*prediction.float().tolist(), strict=True)]
            columns = [guesses, *(values for _, values in labels), *scores]
        else:
            # Any other model's: its outputs as they are, then the labels.
            size, outputs = _outputs(prediction, "prediction", "predict_step's output")
            labels = _labels(batch, size, None, self._labelled) if self._labelled is not False else []
            header = [name for name, _ in [*outputs, *labels]]
            columns = [values for _, values in [*outputs, *labels]]
        if self._header is None:
            self._header = header
            self._write_rows([["file" if self._names is not None else "index", *header]])
        elif header != self._header:
            raise UserError(
                f"predict_step's output for batch {batch_idx} makes the columns {first_few(header, 6)}, unlike the "
                f"first batch's {first_few(self._header, 6)}: return the same keys and shapes (but the batch size) for "
                "every batch"
            )
        if batch_indices is None or len(batch_indices) != size:
            batch_indices = range(self._rows, self._rows + size)  # no indices from the sampler: in order
        names = [self._names[index] for index in batch_indices] if self._names is not None else batch_indices
        self._write_rows([[name, *row] for name, row in zip(names, zip(*columns, strict=True), strict=True)])
        self._rows += size

    def _write_rows(self, rows: list[list]) -> None:
        try:
            if self._writer is None:  # opened at the first rows: no file where predict_step returns nothing
                temporary = self._writing.enter_context(written_whole(self._target))
                self._writer = csv.writer(self._writing.enter_context(temporary.open("x", newline="")))
            self._writer.writerows(rows)
        except OSError as err:
            self._not_written(err)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._header is None:  # predict_step returned None for every batch
            self._say(f"predict_step returned nothing: no {self._target} was written")
            return
        try:
            self._writing.close()
        except OSError as err:
            self._not_written(err)
        self._say(f"predictions for {self._rows} inputs written to {self._target}")

    def _say(self, line: str) -> None:
        if self.announce:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._discard(exception)

    def _discard(self, err: BaseException) -> None:
        """Close the file and remove it: out of an exception, written_whole removes it rather than renaming it."""
        with contextlib.suppress(OSError):  # closing flushes: a full disk fails again here
            self._writing.__exit__(type(err), err, err.__traceback__)

    def _not_written(self, err: OSError):
        """Stop with one line: the disk is full, the folder read-only, ... (the temporary file is removed)."""
        self._discard(err)
        raise UserError(
            f"--predictions.path {self._target} cannot be written ({first_line(err)}): "
            "free some space there, or give another --predictions.path"
        ) from err


def _outputs(output: Any, prefix: str, what: str) -> tuple[int, list[tuple[str, list[str]]]]:
    """The batch size of ``what`` (``predict_step``'s output, the labels), and its columns, ``(name, one text per
    input)``: a tensor's values (``prefix``, ``prefix_0``, ``prefix_0_1``), a dict's under its keys, a tuple's or
    list's under ``prefix_<i>``. A tensor without the batch's dimension, a value of another type, or more than
    ``MAX_COLUMNS`` values an input are refused in one line."""
    leaves = list(_leaves(output, prefix, what, depth=0))
    sizes = {len(tensor) for _, tensor in leaves}
    if len(sizes) > 1:
        shapes = ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in leaves)
        raise UserError(f"{what} is tensors that differ in their first dimension, the batch's: {shapes}")
    count = sum(math.prod(tensor.shape[1:]) for _, tensor in leaves)
    if count > MAX_COLUMNS:
        raise UserError(
            f"{what} holds {count} values an input, more than the {MAX_COLUMNS} columns a predictions CSV takes: "
            "return fewer from predict_step (a summary, the top classes), or write them with a BasePredictionWriter "
            "of your own"
        )
    columns = []
    for name, tensor in leaves:
        if tensor.ndim == 1:
            names = [name]
        else:
            indices = itertools.product(*map(range, tensor.shape[1:]))  # in the values' order: the last fastest
            names = [f"{name}_{'_'.join(map(str, where))}" for where in indices]
        texts = _texts(tensor.detach().reshape(len(tensor), -1))  # tolist() reads the values wherever they are
        columns += [(column, [row[k] for row in texts]) for k, column in enumerate(names)]
    return sizes.pop(), columns


def _leaves(output: Any, prefix: str, what: str, depth: int):
    """The tensors in ``output``, each with its column's name."""
    if depth > MAX_DEPTH:
        raise UserError(f"{what} nests deeper than {MAX_DEPTH} levels: return a tensor, or a dict of them")
    if isinstance(output, torch.Tensor):
        if output.ndim == 0:
            raise UserError(
                f"{what} ({prefix}) is a single number, not one an input: return a tensor whose first dimension is "
                "the batch's"
            )
        yield prefix, output
    elif isinstance(output, Mapping) and output:
        for key, value in output.items():
            yield from _leaves(value, str(key) if depth == 0 else f"{prefix}_{key}", what, depth + 1)
    elif isinstance(output, list | tuple) and output:
        for index, value in enumerate(output):
            yield from _leaves(value, f"{prefix}_{index}", what, depth + 1)
    else:
        raise UserError(
            f"{what} ({prefix}) is {type(output).__name__}, which a predictions CSV cannot hold: return a tensor "
            "(batch, ...), or a dict or tuple of them"
        )


def _texts(values: torch.Tensor) -> list[list[str]]:
    """A ``(batch, N)`` tensor's values as text: float64 exactly, other floats to 7 significant digits (a float32's
    precision), integers and booleans as numbers."""
    if values.dtype == torch.float64:
        return [[repr(value) for value in row] for row in values.tolist()]
    if values.is_floating_point():
        return [[f"{value:.7g}" for value in row] for row in values.float().tolist()]
    if values.dtype == torch.bool:
        values = values.long()
    return [[str(value) for value in row] for row in values.tolist()]


def _labels(batch: Any, size: int, classes: list[str] | None, where: Any = True) -> list[tuple[str, list[str]]]:
    """The inputs' labels as columns: ``label``, the class name where the classes are known, else the values as
    they are (``label_0`` ... for several an input).

    ``where`` is the data module's ``predict_labelled``: the key of a dict batch, or the position of a tuple's item,
    that holds them; ``True`` for a dict's ``label`` or the second of a tuple of two (``(inputs, labels)``). A tuple
    of more items says nothing of which is the labels (``(audio, lengths, labels)``): it must be named.
    """
    if isinstance(batch, Mapping):
        key = where if isinstance(where, str) else "label"
        labels = batch.get(key)
        said = f"its {key!r} key"
    elif isinstance(batch, list | tuple):
        if where is True and len(batch) > 2:
            raise UserError(
                f"the data module's predict_labelled is true, but its predict batches hold {len(batch)} items: which "
                "of them is the labels? Set predict_labelled to its position (an int), or to false"
            )
        position = where if isinstance(where, int) and not isinstance(where, bool) else 1
        labels = batch[position] if -len(batch) <= position < len(batch) else None
        said = f"the batch's item {position}"
    else:
        labels, said = None, "a batch's second item, or its 'label' key"
    if not isinstance(labels, torch.Tensor) or labels.ndim == 0 or len(labels) != size:
        raise UserError(
            f"the data module's predict_labelled is {where!r}, but its predict batches hold no labels there, one an "
            f"input ({said}): set predict_labelled false, or to where the labels are"
        )
    if classes is not None and labels.ndim == 1 and not labels.is_floating_point():
        return [("label", [classes[k] if 0 <= k < len(classes) else str(k) for k in labels.tolist()])]
    return _outputs(labels, "label", "the labels")[1]
