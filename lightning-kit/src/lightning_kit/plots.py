"""Plots of a run: a curve for each metric it logged per epoch, and the validation confusion matrix.

Each metric is one plot, its stages' series on it: ``train/mae`` and ``val/mae`` (or
``train_mae`` and ``val_mae``, Lightning's ``_epoch`` ones) are drawn into ``mae.png``,
the loss into ``loss.png``, accuracy into ``accuracy.png``; a metric logged only per step
is no epoch curve (``metric_logs.py`` says how each name is read). File names are made
from metric names with letters, digits, ``.``, ``-`` and ``_`` only, and at most
``MAX_CURVES`` are drawn. Each file is written beside its name and renamed into place: a
link planted at that name is replaced, never written through.

Epochs count from 0 here as everywhere else (checkpoint names ``best-epoch=0-...``,
``metrics.csv``, the end of ``fit``, the table of runs): Lightning's ``epoch``.
Drawn into the run's folder after ``fit``; redraw them from a run's logs with

    python -m lightning_kit.plots runs/lightning_logs/version_0
"""

import contextlib
import csv
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from .config_files import read_config_file
from .errors import OneLineParser, UserError, command, invoked_as, printable
from .installation import check_installation
from .metric_logs import STAGE_LABELS, MetricLog, parse_name, read_metric_log

METRICS_FILE = "metrics.csv"
CONFUSION_FILE = "confusion_matrix.csv"
CONFUSION_PLOT = "confusion_matrix.png"
# The first cell of the confusion matrix's CSV: rows are the true classes, columns the predicted ones.
CONFUSION_CORNER = "true \\ predicted"
# How an axis of epochs is labelled: the numbers are Lightning's, from 0.
EPOCH_AXIS = "epoch (from 0)"
# Above this many classes, the confusion matrix's cells are drawn without their counts, which would be unreadable.
COUNTS_UP_TO = 30
# At most this many curves, the loss and accuracy first: a run that logs hundreds of metrics gets these.
MAX_CURVES = 30
# The longest file name made from a metric's name, before ``.png``.
MAX_STEM = 64
# Values beyond this size are not drawn (nor inf, nor NaN): matplotlib cannot lay out an axis across them.
MAX_DRAWN = 1e300
# Titles of the metrics everyone logs; any other is titled by its own name.
TITLES = {"loss": "Loss", "accuracy": "Accuracy"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-]+")


@dataclass
class Curve:
    """One plot of a metric by epoch: its file, its title, and its series, ``(label, metrics.csv column)``."""

    filename: str
    metric: str
    series: list[tuple[str, str]]

    @property
    def title(self) -> str:
        return TITLES.get(self.metric, self.metric)


def plot_run(run_dir: str | Path, confusion_epoch: int | None = None, confusion_which: str = "") -> list[Path]:
    """Draw the plots of the run in ``run_dir`` from its ``metrics.csv`` and confusion matrix; return their paths.

    ``confusion_epoch`` names the confusion matrix's epoch and ``confusion_which`` which one it
    is (``"the best checkpoint's"``); by default, it is taken for the last validation's, the
    last epoch with validation metrics in ``metrics.csv``. When the run logged more metrics than
    ``MAX_CURVES``, a note on stderr says how many were not drawn.
    """
    run_dir = Path(run_dir)
    written = []
    # Curves need the CSV logger's metrics.csv; with another logger, use its own viewer.
    log = read_history(run_dir) if (run_dir / METRICS_FILE).is_file() else MetricLog()
    curves, left_out = plan_curves(log)
    if left_out:
        sys.stderr.write(
            f"note: {run_dir} logs {len(curves) + left_out} metrics per epoch: {len(curves)} are drawn "
            f"(at most {MAX_CURVES}, the loss and accuracy first), {left_out} are not\n"
        )
    for curve in curves:
        path = _draw_curve(curve, log, run_dir)
        if path is not None:
            written.append(path)
    confusion_path = run_dir / CONFUSION_FILE
    if confusion_path.is_file():
        if confusion_epoch is None:
            confusion_epoch = log.last_validated()
            confusion_which = "the last" if confusion_epoch is not None else ""
        written.append(_draw_confusion(confusion_path, confusion_epoch, confusion_which, run_dir / CONFUSION_PLOT))
    return written


def plan_curves(log: MetricLog) -> tuple[list[Curve], int]:
    """The curves to draw from ``log`` (one per metric logged per epoch, at most ``MAX_CURVES``, the loss and
    accuracy first), and how many more metrics there were."""
    by_metric: dict[str, list[str]] = {}
    for column in log.epoch_columns():
        by_metric.setdefault(parse_name(column).metric, []).append(column)
    first = [metric for metric in TITLES if metric in by_metric]
    order = first + [metric for metric in by_metric if metric not in TITLES]
    taken = {CONFUSION_PLOT}
    curves = []
    for metric in order[:MAX_CURVES]:
        filename = _file_name(metric, taken)
        taken.add(filename.lower())
        curves.append(Curve(filename, metric, _series(by_metric[metric])))
    return curves, len(order) - len(curves)


def _series(columns: list[str]) -> list[tuple[str, str]]:
    """Each column's legend label, its stage in words (``train``, ``validation``), ordered train, validation,
    test; a column without a stage, or sharing its stage with another, is labelled by its name."""
    ranks = {stage: rank for rank, stage in enumerate(STAGE_LABELS)}
    stages = {column: parse_name(column).stage for column in columns}
    columns = sorted(columns, key=lambda column: ranks.get(stages[column], len(ranks)))
    labels = [STAGE_LABELS.get(stages[column], column) for column in columns]
    return [
        (label if labels.count(label) == 1 else column, column) for label, column in zip(labels, columns, strict=True)
    ]


def _file_name(metric: str, taken: set[str]) -> str:
    """A PNG's name for ``metric``: letters, digits, ``.``, ``-`` and ``_`` (no folder, no hidden file), at most
    ``MAX_STEM`` of them, and none of ``taken`` (compared without case, as some file systems do)."""
    stem = _UNSAFE.sub("_", metric).strip("._-")[:MAX_STEM] or "metric"
    name, count = f"{stem}.png", 1
    while name.lower() in taken:
        count += 1
        name = f"{stem}-{count}.png"
    return name


def _draw_curve(curve: Curve, log: MetricLog, run_dir: Path) -> Path | None:
    """Draw ``curve`` into the run's folder; None when none of its values can be drawn."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, column in curve.series:
        points = sorted((epoch, value) for epoch, value in log.epochs[column].items() if drawable(value))
        if points:
            axes.plot([epoch for epoch, _ in points], [value for _, value in points], marker="o", label=label)
    if not axes.lines:
        plt.close(figure)
        return None
    axes.set(title=curve.title, xlabel=EPOCH_AXIS, ylabel=curve.metric)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, run_dir / curve.filename)


def drawable(value: float) -> bool:
    """Whether ``value`` can be drawn: a finite number, within ``MAX_DRAWN``."""
    return math.isfinite(value) and abs(value) <= MAX_DRAWN


def _draw_confusion(path: Path, epoch: int | None, which: str, target: Path) -> Path:
    plt = _pyplot()
    names, matrix = read_confusion(path)
    side = min(0.4 * len(names), 12)  # room for the names, within a page
    figure, axes = plt.subplots(figsize=(max(6, side + 3), max(5, side + 2)))
    image = axes.imshow(matrix, cmap="Blues")
    figure.colorbar(image, ax=axes)
    for row, counts in enumerate(matrix if len(names) <= COUNTS_UP_TO else ()):
        for column, count in enumerate(counts):
            axes.text(column, row, str(count), ha="center", va="center", fontsize=7)
    title = "Validation confusion matrix"
    if epoch is not None:
        title += f", epoch {epoch}" + (f" ({which})" if which else "")
    axes.set(title=title, xlabel="predicted class", ylabel="true class")
    if len(names) <= COUNTS_UP_TO:
        long_names = max(map(len, names), default=0) > 3  # slanted, so that neighbours do not overlap
        slant = {"rotation": 45, "ha": "right"} if long_names else {}
        axes.set_xticks(range(len(names)), names, **slant)
        axes.set_yticks(range(len(names)), names)
    return _save(figure, target)


def write_confusion(path: Path, matrix: list[list[int]], class_names: list[str] | None = None) -> None:
    """Write a confusion matrix (rows true classes, columns predicted) as CSV, with a header row and column of
    class names: ``class_names`` where given, one per class, else the label numbers."""
    names = [str(name) for name in class_names or ()]
    if len(names) != len(matrix):
        names = [str(label) for label in range(len(matrix))]
    with written_into_place(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([CONFUSION_CORNER, *names])
        writer.writerows([name, *counts] for name, counts in zip(names, matrix, strict=True))


def read_confusion(path: Path) -> tuple[list[str], list[list[int]]]:
    """A confusion matrix's CSV as its class names and counts; one without a header (an older run's) is named by
    label numbers. ValueError says what is wrong with it."""
    with path.open(newline="") as file:
        rows = list(csv.reader(file))
    headed = bool(rows) and rows[0][:1] == [CONFUSION_CORNER]
    names = rows[0][1:] if headed else [str(label) for label in range(len(rows))]
    body = [row[1:] for row in rows[1:]] if headed else rows
    try:
        matrix = [[int(float(count)) for count in row] for row in body]
    except (ValueError, OverflowError) as err:  # not a number; infinite
        raise ValueError(f"{path} is not a confusion matrix ({err})") from None
    if len(matrix) != len(names) or any(len(row) != len(names) for row in matrix):
        raise ValueError(f"{path} is not a confusion matrix: {len(names)} classes, rows of other lengths")
    return names, matrix


def read_history(run_dir: Path, seen: frozenset[Path] = frozenset()) -> MetricLog:
    """The run's metric log, preceded by those of the runs it resumed from.

    A resumed run logs into a folder of its own; its ``config.yaml`` names the checkpoint it started
    from, whose run folder holds the earlier epochs. The file is read as data, with bounds; a chain of
    runs that resume each other is followed once around.
    """
    log = read_epoch_metrics(run_dir / METRICS_FILE)
    config_path = run_dir / "config.yaml"
    settings = yaml.safe_load(read_config_file(config_path)) if config_path.is_file() else None
    ckpt_path = settings.get("ckpt_path") if isinstance(settings, dict) else None
    earlier_dir = Path(ckpt_path).parent.parent if isinstance(ckpt_path, str) and ckpt_path else None
    here = run_dir.resolve()
    if (
        earlier_dir is not None
        and earlier_dir.resolve() not in {here, *seen}
        and (earlier_dir / METRICS_FILE).is_file()
    ):
        log = log.continuing(read_history(earlier_dir, seen | {here}))
    return log


def read_epoch_metrics(path: Path) -> MetricLog:
    """Read a CSVLogger ``metrics.csv``: each column's last value in each epoch, and which are logged per step."""
    with path.open(newline="") as file:
        return read_metric_log(file, where=str(path))


@contextlib.contextmanager
def written_into_place(path: Path, mode: str = "wb", **options) -> Iterator[IO]:
    """A new file opened for writing beside ``path``, renamed to ``path`` when the block ends without an error.

    So a reader never finds half a file, and a link at ``path`` (to a user's file, or to nowhere) is
    replaced by the file, never written through. The file beside it is made anew (``x``): a link
    planted at its name is removed first, not followed. On an error it is removed.
    """
    temporary = path.with_name(f".writing.{os.getpid()}.{path.name}")
    temporary.unlink(missing_ok=True)
    try:
        with temporary.open(mode.replace("w", "x"), **options) as file:
            yield file
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _pyplot():
    """matplotlib's pyplot, drawing to files only; imported on first use, as it is slow to import."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _save(figure, path: Path) -> Path:
    """Save ``figure`` as a PNG into ``path`` (beside it, then renamed into place) and close it."""
    try:
        figure.tight_layout()
        with written_into_place(Path(path)) as file:
            figure.savefig(file, format="png", dpi=100)
    except OSError as err:  # a full disk, past `ulimit -f`: nothing is left beside it (written_into_place)
        raise UserError(f"{path} cannot be written ({err.strerror or err}): give a folder with room") from err
    finally:
        _pyplot().close(figure)
    return path


@command
def main(args: list[str] | None = None) -> None:
    check_installation()
    parser = OneLineParser(
        prog=invoked_as("python -m lightning_kit.plots"), description="Redraw the plots of a run from its logs."
    )
    parser.add_argument("run_dir", help="a run's folder, e.g. runs/lightning_logs/version_0")
    options = parser.parse_args(args)
    folder, metrics = Path(options.run_dir), Path(options.run_dir) / METRICS_FILE
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        parser.exit(1, f"error: {options.run_dir} {what}: give a run's folder, e.g. runs/lightning_logs/version_0\n")
    if metrics.exists() and not metrics.is_file():
        parser.exit(1, f"error: {metrics} is not a plain file (a FIFO, a device or a folder): no plots drawn\n")
    try:
        paths = plot_run(options.run_dir)
    except UserError as err:
        parser.exit(1, f"error: the plots of {options.run_dir} cannot be drawn: {err}\n")
    except (OSError, ValueError, ArithmeticError, csv.Error) as err:
        parser.exit(1, f"error: the plots of {options.run_dir} cannot be drawn: {err}\n")
    if not paths:
        if (Path(options.run_dir) / METRICS_FILE).is_file():
            parser.exit(
                1,
                f"error: {options.run_dir}/{METRICS_FILE} holds no metric logged per epoch with a finite value, "
                "and there is no confusion matrix (a metric logged only per step is no epoch curve)\n",
            )
        parser.exit(1, f"error: {options.run_dir} holds neither {METRICS_FILE} nor {CONFUSION_FILE}\n")
    for path in paths:
        print(printable(str(path)))  # the run's folder is named by whoever made it: no control reaches the terminal


if __name__ == "__main__":
    main()
