"""What each logged metric's name says of its stage (the table of runs reads ``metrics.csv`` by it).

A name says its stage in any of the usual ways, ``val/mae``, ``val_mae``, ``mae/val``, with
Lightning's ``_epoch`` or ``_step`` added when a metric is logged both per step and per epoch.
Validation and test metrics are per epoch (a validation run more than once an epoch keeps its
last), unless their name says ``_step``.

Only the standard library: the table of runs reads it without PyTorch.
"""

import re
from typing import NamedTuple

# How stages are written, and the stage each stands for.
STAGES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}

_WORDS = "|".join(sorted(STAGES, key=len, reverse=True))
# The stage first (``val/mae``), else last (``mae/val``).
_STAGED = re.compile(rf"(?:({_WORDS})[/_.\-].+)|(?:.+?[/_.\-]({_WORDS}))", re.IGNORECASE)


class MetricName(NamedTuple):
    """A logged name, understood: ``val/mae_epoch`` is of the validation stage, logged per epoch."""

    stage: str | None  # "train", "val", "test", or None (``lr-Adam``)
    per_step: bool  # named so by Lightning (``_step``)


def parse_name(column: str) -> MetricName:
    """What ``column`` says: its stage (from ``val/mae``, ``val_mae``, ``mae/val``), and Lightning's ``_step``."""
    base, per_step = column, False
    if column.endswith("_step") and len(column) > 5:
        base, per_step = column[:-5], True
    elif column.endswith("_epoch") and len(column) > 6:
        base = column[:-6]
    match = _STAGED.fullmatch(base)
    return MetricName(STAGES[(match.group(1) or match.group(2)).lower()] if match else None, per_step)


def epoch_columns(epochs: dict[str, dict[int, float]], stage: str) -> list[str]:
    """The columns of ``stage`` (``val``, ``test``) logged per epoch, in the file's order: not Lightning's ``_step``."""
    return [column for column in epochs if (name := parse_name(column)).stage == stage and not name.per_step]
