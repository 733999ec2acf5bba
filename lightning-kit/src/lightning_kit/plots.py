"""Plots of a run: loss and accuracy curves, and the validation confusion matrix.

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
# (file, title, [(series label, metrics.csv column), ...])
CURVES = (
    ("loss.png", "Loss", (("train", "train/loss"), ("validation", "val/loss"))),
    ("accuracy.png", "Accuracy", (("train", "train/acc"), ("validation", "val/acc"))),
)


def plot_run(run_dir: str | Path, confusion_epoch: int | None = None) -> list[Path]:
    """Draw the plots of the run in ``run_dir`` from its ``metrics.csv`` and confusion matrix; return their paths.

    The confusion matrix is the last validation's; ``confusion_epoch`` names its epoch
    (by default, the last epoch with validation metrics in ``metrics.csv``).
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
                axes.plot([epoch + 1 for epoch, _ in points], [value for _, value in points], marker="o", label=label)
        axes.set(title=title, xlabel="epoch", ylabel=title.lower())
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend()
        written.append(_save(figure, run_dir / filename))
    confusion_path = run_dir / CONFUSION_FILE
    if confusion_path.is_file():
        with confusion_path.open() as file:
            matrix = [[int(float(count)) for count in row] for row in csv.reader(file)]
        figure, axes = plt.subplots(figsize=(6, 5))
        image = axes.imshow(matrix, cmap="Blues")
        figure.colorbar(image, ax=axes)
        for row, counts in enumerate(matrix):
            for column, count in enumerate(counts):
                axes.text(column, row, str(count), ha="center", va="center", fontsize=7)
        validated = sorted(per_epoch.get("val/acc", {}))
        epoch = confusion_epoch if confusion_epoch is not None else validated[-1] if validated else None
        # Epochs count from 1 on the curves, as here.
        title = "Validation confusion matrix" + (f", epoch {epoch + 1} (the last)" if epoch is not None else "")
        axes.set(title=title, xlabel="predicted class", ylabel="true class")
        axes.set(xticks=range(len(matrix)), yticks=range(len(matrix)))
        written.append(_save(figure, run_dir / "confusion_matrix.png"))
    return written


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
