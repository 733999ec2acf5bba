"""Plots of a run: loss and accuracy curves, and the validation confusion matrix.

Epochs count from 0 here as everywhere else (checkpoint names ``best-epoch=0-...``,
``metrics.csv``, the end of ``fit``, the table of runs): Lightning's ``epoch``.
Drawn into the run's folder after ``fit``; redraw them from a run's logs with

    python -m lightning_kit.plots runs/lightning_logs/version_0
"""

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import yaml

METRICS_FILE = "metrics.csv"
CONFUSION_FILE = "confusion_matrix.csv"
# The first cell of the confusion matrix's CSV: rows are the true classes, columns the predicted ones.
CONFUSION_CORNER = "true \\ predicted"
# How an axis of epochs is labelled: the numbers are Lightning's, from 0.
EPOCH_AXIS = "epoch (from 0)"
# Above this many classes, the confusion matrix's cells are drawn without their counts, which would be unreadable.
COUNTS_UP_TO = 30
# (file, title, [(series label, metrics.csv column), ...])
CURVES = (
    ("loss.png", "Loss", (("train", "train/loss"), ("validation", "val/loss"))),
    ("accuracy.png", "Accuracy", (("train", "train/acc"), ("validation", "val/acc"))),
)


def plot_run(run_dir: str | Path, confusion_epoch: int | None = None, confusion_which: str = "") -> list[Path]:
    """Draw the plots of the run in ``run_dir`` from its ``metrics.csv`` and confusion matrix; return their paths.

    ``confusion_epoch`` names the confusion matrix's epoch and ``confusion_which`` which one it
    is (``"the best checkpoint's"``); by default, it is taken for the last validation's, the
    last epoch with validation metrics in ``metrics.csv``.
    """
    plt = _pyplot()
    run_dir = Path(run_dir)
    written = []
    # Curves need the CSV logger's metrics.csv; with another logger, use its own viewer.
    per_epoch = read_history(run_dir) if (run_dir / METRICS_FILE).is_file() else {}
    for filename, title, series in CURVES if per_epoch else ():
        figure, axes = plt.subplots(figsize=(6, 4))
        for label, column in series:
            points = sorted(per_epoch.get(column, {}).items())
            if points:
                axes.plot([epoch for epoch, _ in points], [value for _, value in points], marker="o", label=label)
        axes.set(title=title, xlabel=EPOCH_AXIS, ylabel=title.lower())
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend()
        written.append(_save(figure, run_dir / filename))
    confusion_path = run_dir / CONFUSION_FILE
    if confusion_path.is_file():
        names, matrix = read_confusion(confusion_path)
        side = min(0.4 * len(names), 12)  # room for the names, within a page
        figure, axes = plt.subplots(figsize=(max(6, side + 3), max(5, side + 2)))
        image = axes.imshow(matrix, cmap="Blues")
        figure.colorbar(image, ax=axes)
        for row, counts in enumerate(matrix if len(names) <= COUNTS_UP_TO else ()):
            for column, count in enumerate(counts):
                axes.text(column, row, str(count), ha="center", va="center", fontsize=7)
        if confusion_epoch is None:
            validated = sorted(per_epoch.get("val/acc", {}))
            confusion_epoch, confusion_which = (validated[-1], "the last") if validated else (None, "")
        title = "Validation confusion matrix"
        if confusion_epoch is not None:
            title += f", epoch {confusion_epoch}" + (f" ({confusion_which})" if confusion_which else "")
        axes.set(title=title, xlabel="predicted class", ylabel="true class")
        if len(names) <= COUNTS_UP_TO:
            long_names = max(map(len, names), default=0) > 3  # slanted, so that neighbours do not overlap
            slant = {"rotation": 45, "ha": "right"} if long_names else {}
            axes.set_xticks(range(len(names)), names, **slant)
            axes.set_yticks(range(len(names)), names)
        written.append(_save(figure, run_dir / "confusion_matrix.png"))
    return written


def write_confusion(path: Path, matrix: list[list[int]], class_names: list[str] | None = None) -> None:
    """Write a confusion matrix (rows true classes, columns predicted) as CSV, with a header row and column of
    class names: ``class_names`` where given, one per class, else the label numbers."""
    names = [str(name) for name in class_names or ()]
    if len(names) != len(matrix):
        names = [str(label) for label in range(len(matrix))]
    with path.open("w", newline="") as file:
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


def read_history(run_dir: Path) -> dict[str, dict[int, float]]:
    """The run's per-epoch metrics, preceded by those of the runs it resumed from.

    A resumed run logs into a folder of its own; its ``config.yaml`` names the
    checkpoint it started from, whose run folder holds the earlier epochs.
    """
    history = read_epoch_metrics(run_dir / METRICS_FILE)
    config_path = run_dir / "config.yaml"
    ckpt_path = yaml.safe_load(config_path.read_text()).get("ckpt_path") if config_path.is_file() else None
    earlier_dir = Path(ckpt_path).parent.parent if ckpt_path else None
    if (
        earlier_dir is not None
        and earlier_dir.resolve() != run_dir.resolve()
        and (earlier_dir / METRICS_FILE).is_file()
    ):
        for column, values in read_history(earlier_dir).items():
            history[column] = {**values, **history.get(column, {})}
    return history


def read_epoch_metrics(path: Path) -> dict[str, dict[int, float]]:
    """Read a CSVLogger ``metrics.csv`` into ``{column: {epoch: value}}``, keeping each epoch's last value."""
    values: dict[str, dict[int, float]] = defaultdict(dict)
    with path.open() as file:
        for line, row in enumerate(csv.DictReader(file), start=2):
            if not row.get("epoch"):
                continue
            try:
                epoch = int(float(row["epoch"]))
                for column, value in row.items():
                    if value and column not in ("epoch", "step"):
                        values[column][epoch] = float(value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}, line {line}, is not a metrics row ({err})") from None
    return values


def _pyplot():
    """matplotlib's pyplot, drawing to files only; imported on first use, as it is slow to import."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    _pyplot().close(figure)
    return path


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Redraw the plots of a run from its logs.")
    parser.add_argument("run_dir", help="a run's folder, e.g. runs/lightning_logs/version_0")
    options = parser.parse_args(args)
    try:
        paths = plot_run(options.run_dir)
    except (OSError, ValueError, csv.Error) as err:
        parser.exit(1, f"error: the plots of {options.run_dir} cannot be drawn: {err}\n")
    if not paths:
        parser.exit(1, f"error: {options.run_dir} holds neither {METRICS_FILE} nor {CONFUSION_FILE}\n")
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
