"""A run's metric log as data: ``metrics.csv`` by epoch, and what each logged name says.

Lightning's ``CSVLogger`` writes a row per logging call, each with its ``epoch`` and
``step``. A name says its stage and metric in any of the usual ways, ``val/mae``,
``val_mae``, ``mae/val``, with Lightning's ``_epoch`` or ``_step`` added when a metric is
logged both per step and per epoch. Validation and test metrics are per epoch (a
validation run more than once an epoch keeps its last), unless their name says ``_step``.

Only the standard library: the table of runs reads it without PyTorch.
"""

import csv
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

# How stages are written, and the stage each stands for.
STAGES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
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


def epoch_columns(epochs: dict[str, dict[int, float]], stage: str) -> list[str]:
    """The columns of ``stage`` (``val``, ``test``) logged per epoch, in the file's order: not Lightning's ``_step``."""
    return [column for column in epochs if (name := parse_name(column)).stage == stage and not name.per_step]


def read_metric_log(lines: Iterable[str]) -> dict[str, dict[int, float]]:
    """Each column's value at each epoch (its last there), ``{column: {epoch: value}}``, of a CSVLogger
    ``metrics.csv`` read from its ``lines``. ValueError names the line that is no metrics row."""
    epochs: dict[str, dict[int, float]] = {}
    for line, row in enumerate(csv.DictReader(lines), start=2):
        if not row.get("epoch"):
            continue
        try:
            epoch = _epoch(row["epoch"])
            for column, value in row.items():
                if value and isinstance(column, str) and column not in ("epoch", "step"):
                    epochs.setdefault(column, {})[epoch] = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"line {line} is not a metrics row ({err})") from None
    return epochs


def _epoch(text: str) -> int:
    value = float(text)
    if not (math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_EPOCH):
        raise ValueError(f"epoch {text!r} is not an epoch number, a whole number from 0 to {MAX_EPOCH}")
    return int(value)
