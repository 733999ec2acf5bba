"""What a logged metric's name says of its stage (``val/mae``, ``val_mae``, ``mae/val``) and whether Lightning logged
it per step (``_step``). The standard library only: the table of runs reads it without PyTorch.
"""

import re
from typing import NamedTuple

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
