"""A run's metric log as data: ``metrics.csv`` by epoch, and what each logged name says.

Lightning's ``CSVLogger`` writes a row per logging call, each with its ``epoch`` and
``step``: values logged per epoch come at the epoch's last step (a validation, and a
training epoch's end), values logged per step every ``log_every_n_steps`` steps. A
name says its stage and metric in any of the usual ways, ``val/mae``, ``val_mae``,
``mae/val``, with Lightning's ``_epoch`` or ``_step`` added when a metric is logged
both per step and per epoch. A metric logged only per step is found by its values: a
training metric with more than one value in an epoch, or one before the epoch's last
step. (Validation and test metrics are per epoch: a validation run more than once an
epoch keeps its last.)

Only the standard library: the table of runs reads it without PyTorch.
"""

import csv
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# How stages are written, and the stage each stands for.
STAGES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
# The stages in words, for a plot's legend.
STAGE_LABELS = {"train": "train", "val": "validation", "test": "test"}
# Names of one metric: ``train/acc`` and ``val/accuracy`` are both accuracy.
ALIASES = {"acc": "accuracy"}
# An epoch number above this is not one Lightning wrote (nor a float's 1e300, nor inf).
MAX_EPOCH = 10**9

_WORDS = "|".join(sorted(STAGES, key=len, reverse=True))
_STAGE_FIRST = re.compile(rf"({_WORDS})[/_.\-](.+)", re.IGNORECASE)
_STAGE_LAST = re.compile(rf"(.+?)[/_.\-]({_WORDS})", re.IGNORECASE)


@dataclass(frozen=True)
class MetricName:
    """A logged name, understood: ``val/mae_epoch`` is the validation stage's ``mae``, logged per epoch."""

    column: str  # as logged
    stage: str | None  # "train", "val", "test", or None (``lr-Adam``)
    metric: str  # "mae", "loss", "accuracy"; the whole name (without Lightning's suffix) when no stage is in it
    per_step: bool  # named so by Lightning (``_step``)


def parse_name(column: str) -> MetricName:
    """What ``column`` names: its stage (from ``val/mae``, ``val_mae``, ``mae/val``), metric and suffix."""
    base, per_step = column, False
    if column.endswith("_step") and len(column) > 5:
        base, per_step = column[:-5], True
    elif column.endswith("_epoch") and len(column) > 6:
        base = column[:-6]
    stage, metric = None, base
    match = _STAGE_FIRST.fullmatch(base)
    if match:
        stage, metric = STAGES[match.group(1).lower()], match.group(2)
    else:
        match = _STAGE_LAST.fullmatch(base)
        if match:
            stage, metric = STAGES[match.group(2).lower()], match.group(1)
    return MetricName(column, stage, ALIASES.get(metric.lower(), metric), per_step)


@dataclass
class MetricLog:
    """``metrics.csv`` as read: each column's value at each epoch (its last there), and the columns logged per step."""

    epochs: dict[str, dict[int, float]] = field(default_factory=dict)  # {column: {epoch: value}}
    per_step: set[str] = field(default_factory=set)

    def epoch_columns(self, stage: str | None = None) -> list[str]:
        """The columns logged per epoch, in the file's order; only ``stage``'s, where given."""
        return [
            column
            for column in self.epochs
            if column not in self.per_step and (stage is None or parse_name(column).stage == stage)
        ]

    def last_validated(self) -> int | None:
        """The last epoch with a validation metric, or None."""
        return max((epoch for column in self.epoch_columns("val") for epoch in self.epochs[column]), default=None)

    def continuing(self, earlier: "MetricLog") -> "MetricLog":
        """This log after ``earlier``'s, a run's before it resumed: this one's value wins for an epoch in both."""
        epochs = {column: dict(values) for column, values in earlier.epochs.items()}
        for column, values in self.epochs.items():
            epochs[column] = {**epochs.get(column, {}), **values}
        return MetricLog(epochs, self.per_step | earlier.per_step)


def read_metric_log(lines: Iterable[str], where: str = "") -> MetricLog:
    """Read a CSVLogger ``metrics.csv`` from its ``lines``. ValueError names the line that is no metrics row (and
    ``where``, the file, when given)."""
    log = MetricLog()
    last_step: dict[int, float] = {}  # each epoch's last step
    steps: dict[str, list[tuple[int, float | None]]] = {}  # each column's values' epochs and steps
    for line, row in enumerate(csv.DictReader(lines), start=2):
        if not row.get("epoch"):
            continue
        try:
            epoch = _epoch(row["epoch"])
            step = _step(row.get("step"))
            for column, value in row.items():
                if value and isinstance(column, str) and column not in ("epoch", "step"):
                    log.epochs.setdefault(column, {})[epoch] = float(value)
                    steps.setdefault(column, []).append((epoch, step))
        except (TypeError, ValueError) as err:
            at = f"{where}, line {line}," if where else f"line {line}"
            raise ValueError(f"{at} is not a metrics row ({err})") from None
        if step is not None:
            last_step[epoch] = max(step, last_step.get(epoch, step))
    for column, logged in steps.items():
        name = parse_name(column)
        if name.per_step:
            log.per_step.add(column)
        elif name.stage not in ("val", "test"):
            epochs = [epoch for epoch, _ in logged]
            early = any(step is not None and step < last_step.get(epoch, step) for epoch, step in logged)
            if early or len(set(epochs)) < len(epochs):
                log.per_step.add(column)
    return log


def _epoch(text: str) -> int:
    value = float(text)
    if not (math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_EPOCH):
        raise ValueError(f"epoch {text!r} is not an epoch number, a whole number from 0 to {MAX_EPOCH}")
    return int(value)


def _step(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None  # only tells a per-step value apart: a damaged step reads as none
