"""The table of runs: its columns, the hyperparameters that differ, sorting, and text, CSV and Markdown."""

import csv
import io
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ..errors import printable
from .folders import Run, best_epoch, best_file, latest_file

# Before the hyperparameters, and after them.
FIRST, LAST = ("run", "started", "status"), ("duration", "checkpoint", "note")
_MISSING = object()


class LastEpoch(int):
    """A ``best_epoch`` cell that is no best: the last validated epoch of a run that monitors no metric. Shown
    ``3 (last)``; a number in CSV and when sorting."""


class Table:
    """One row per run: its folder, start, status, the hyperparameters that differ between the runs, the best
    epoch (or, for a run that monitors no metric, the last validated one) and its validation metrics, the test
    metrics, the duration, the best (or latest) checkpoint and notes."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self.hyperparameters = differing(runs)
        rows, val, test = [], [], []
        for run in runs:
            row, validation = self._row(run)
            rows.append(row)
            val += validation
            test += run.test
        val, test = _ordered(val), _ordered(test)
        self.metrics = set(val) | set(test)
        self.columns = [*FIRST, *self.hyperparameters, "best_epoch", *val, *test, *LAST]
        self.rows = rows

    def _row(self, run: Run) -> tuple[dict[str, Any], list[str]]:
        """The run's row, and the names of its validation metrics."""
        epoch, val, last = best_epoch(run)
        shown = LastEpoch(epoch) if last is not None and epoch is not None else epoch
        row = {"run": run.name, "started": run.started, "status": run.status, "best_epoch": shown, **val, **run.test}
        row.update({key: _setting(run.settings.get(key, _MISSING)) for key in self.hyperparameters})
        checkpoint = run.best_checkpoint or (best_file(run, epoch) if last is None else latest_file(run))
        notes = [*run.notes, *([last] if last else [])]
        row.update(duration=run.duration_s, checkpoint=checkpoint, note="; ".join(notes) or None)
        return row, list(val)

    def sort(self, column: str, descending: bool = False) -> None:
        """Order the rows by ``column``; empty cells last either way. ValueError names the columns accepted."""
        if column not in self.columns:
            raise ValueError(f"--sort {column}: not a column; accepted: {', '.join(self.columns)}")
        present = [row for row in self.rows if _value(row.get(column)) is not None]
        missing = [row for row in self.rows if _value(row.get(column)) is None]
        present.sort(key=lambda row: _sort_key(row[column]), reverse=descending)
        self.rows = present + missing

    def headers(self) -> list[str]:
        """The columns' names as shown: a metric's name comes from a file, and a terminal takes no control from it."""
        return [printable(column) for column in self.columns]

    def text(self) -> str:
        """Aligned columns for a terminal."""
        cells = [self.headers(), *([self._shown(row, column) for column in self.columns] for row in self.rows)]
        widths = [max(len(line[k]) for line in cells) for k in range(len(self.columns))]
        return "".join("  ".join(map(str.ljust, line, widths)).rstrip() + "\n" for line in cells)

    def markdown(self) -> str:
        """A GitHub Markdown table."""
        lines = [[header.replace("|", "\\|") for header in self.headers()], ["---"] * len(self.columns)]
        lines += [[self._shown(row, column).replace("|", "\\|") for column in self.columns] for row in self.rows]
        return "".join("| " + " | ".join(line) + " |\n" for line in lines)

    def _shown(self, row: dict[str, Any], column: str) -> str:
        return _shown(row.get(column), column, metric=column in self.metrics)

    def csv(self) -> str:
        """CSV with full values: times in ISO 8601, durations in seconds, numbers unrounded."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.headers())
        for row in self.rows:
            writer.writerow([_raw(row.get(column)) for column in self.columns])
        return out.getvalue()


def differing(runs: Sequence[Run]) -> list[str]:
    """The settings whose values are not the same in every run (a setting one run lacks differs), in config order."""
    keys = _ordered(key for run in runs for key in run.settings)
    readable = [run for run in runs if run.settings]
    return [key for key in keys if len({_same(run.settings.get(key, _MISSING)) for run in readable}) > 1]


def _setting(value: Any) -> Any:
    return "null" if value is None else value


def _same(value: Any) -> Any:
    """A value that compares equal for equal settings: 0.001 and 1e-3, 64 and 64.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _ordered(keys) -> list[str]:
    return list(dict.fromkeys(keys))


def _value(value: Any) -> Any:
    return None if value is _MISSING else value


def _sort_key(value: Any) -> tuple:
    """Numbers by size, then times, then everything else as text."""
    if isinstance(value, bool):
        return (1, str(value))
    if isinstance(value, int | float):
        return (0, -math.inf if math.isnan(value) else value)
    if isinstance(value, datetime):
        return (0, value.timestamp())
    return (1, str(value))


def _raw(value: Any) -> str:
    value = _value(value)
    if value is None:
        return ""
    return value.isoformat() if isinstance(value, datetime) else printable(str(value))


def _shown(value: Any, column: str, metric: bool = False) -> str:
    """A cell for people: metrics to 4 decimals, durations in seconds, minutes or hours, the start to the
    minute, a last validated epoch as ``3 (last)``; a setting a run lacks is ``-``."""
    if value is _MISSING:
        return "-"
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if column == "duration":
        return duration_text(value)
    if isinstance(value, LastEpoch):
        return f"{int(value)} (last)"
    if isinstance(value, float):
        return f"{value:.4f}" if metric else f"{value:g}"
    return printable(str(value))


def duration_text(seconds: float) -> str:
    """``0.4s``, ``16.3s``, ``3m12s``, ``1h02m``: under a minute to a tenth of a second."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    seconds = round(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


FORMATS: dict[str, Callable[[Table], str]] = {"table": Table.text, "csv": Table.csv, "markdown": Table.markdown}
