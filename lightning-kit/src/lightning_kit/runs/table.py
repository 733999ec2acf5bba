"""The table of runs: its columns, the hyperparameters that differ, sorting, and text, CSV and Markdown."""

import csv
import io
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ..errors import UserError, printable
from .folders import Run, best_epoch, checkpoint_file

FIRST, LAST = ("run", "started", "status"), ("duration", "checkpoint", "note")  # around the hyperparameters
_MISSING = object()


class LastEpoch(int):
    """A ``best_epoch`` cell that is the last validated epoch of a run that monitors no metric: shown ``3 (last)``."""


class Table:
    """One row per run: its folder, start, status, the hyperparameters that differ between the runs, the best
    epoch and its validation metrics, the test metrics, the duration, the checkpoint and notes."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self.hyperparameters = differing(runs)
        self.rows, val = [], []
        for run in runs:
            epoch, metrics, last = best_epoch(run)
            shown = LastEpoch(epoch) if last is not None and epoch is not None else epoch
            row = {"run": run.name, "started": run.started, "status": run.status, "best_epoch": shown, **metrics}
            row.update(run.test)
            row.update({key: run.settings.get(key, _MISSING) for key in self.hyperparameters})
            row.update({key: "null" for key in self.hyperparameters if row[key] is None})
            row["duration"], row["checkpoint"] = run.duration_s, checkpoint_file(run, epoch, last is not None)
            row["note"] = "; ".join([*run.notes, *([last] if last else [])]) or None
            self.rows.append(row)
            val += metrics
        val, test = dict.fromkeys(val), dict.fromkeys(key for run in runs for key in run.test)
        self.metrics = {*val, *test}
        self.columns = [*FIRST, *self.hyperparameters, "best_epoch", *val, *test, *LAST]

    def sort(self, column: str, descending: bool = False) -> None:
        """Order the rows by ``column``; empty cells last either way. UserError names the columns accepted."""
        if column not in self.columns:
            raise UserError(f"--sort {column}: not a column; accepted: {', '.join(self.columns)}")
        present = [row for row in self.rows if not _empty(row.get(column))]
        missing = [row for row in self.rows if _empty(row.get(column))]
        present.sort(key=lambda row: _sort_key(row[column]), reverse=descending)
        self.rows = present + missing

    def cells(self) -> list[list[str]]:
        """The header (a metric's name comes from a file: a terminal takes no control from it), then a line a row."""
        shown = (
            [_shown(row.get(column), column, column in self.metrics) for column in self.columns] for row in self.rows
        )
        return [[printable(column) for column in self.columns], *shown]

    def text(self) -> str:
        """Aligned columns for a terminal."""
        cells = self.cells()
        widths = [max(len(line[k]) for line in cells) for k in range(len(self.columns))]
        return "".join("  ".join(map(str.ljust, line, widths)).rstrip() + "\n" for line in cells)

    def markdown(self) -> str:
        return markdown_table(self.cells())

    def csv(self) -> str:
        """CSV with full values: times in ISO 8601, durations in seconds, numbers unrounded."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(printable(column) for column in self.columns)
        writer.writerows([_raw(row.get(column)) for column in self.columns] for row in self.rows)
        return out.getvalue()


def markdown_table(lines: list[list[str]]) -> str:
    """A GitHub Markdown table of a header and its rows (also the GPU check's)."""
    header, *rows = [[cell.replace("|", "\\|") for cell in line] for line in lines]
    return "".join("| " + " | ".join(line) + " |\n" for line in [header, ["---"] * len(header), *rows])


def differing(runs: Sequence[Run]) -> list[str]:
    """The settings whose values are not the same in every run (a setting one run lacks differs), in config order."""
    keys = dict.fromkeys(key for run in runs for key in run.settings)
    readable = [run for run in runs if run.settings]
    return [key for key in keys if len({_same(run.settings.get(key, _MISSING)) for run in readable}) > 1]


def _same(value: Any) -> Any:
    """A value that compares equal for equal settings: 0.001 and 1e-3, 64 and 64.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _sort_key(value: Any) -> tuple:
    """Numbers by size, then times, then everything else as text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, -math.inf if math.isnan(value) else value)
    if isinstance(value, datetime):
        return (0, value.timestamp())
    return (1, str(value))


def _empty(value: Any) -> bool:
    return value is None or value is _MISSING


def _raw(value: Any) -> str:
    if _empty(value):
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
