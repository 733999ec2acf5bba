"""What each logged metric's name says (the table of runs reads ``metrics.csv`` by these).

A name says its stage and metric in any of the usual ways, ``val/mae``,
``val_mae``, ``mae/val``, with Lightning's ``_epoch`` or ``_step`` added when a metric is
logged both per step and per epoch. Validation and test metrics are per epoch (a
validation run more than once an epoch keeps its last), unless their name says ``_step``.

Only the standard library: the table of runs reads it without PyTorch.
"""

import re
from dataclasses import dataclass

# How stages are written, and the stage each stands for.
STAGES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
# Names of one metric: ``train/acc`` and ``val/accuracy`` are both accuracy.
ALIASES = {"acc": "accuracy"}

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
