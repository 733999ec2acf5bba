"""The validation curves of the runs listed, in one figure: loss and accuracy by epoch, a line per run."""

import math
from collections.abc import Sequence
from pathlib import Path

from ..plots import EPOCH_AXIS, _pyplot, _save
from .folders import Run, full_history

CURVES = (("val/loss", "Validation loss"), ("val/acc", "Validation accuracy"))
# More lines than this make a legend that hides the curves: the runs are then named in the table only.
MAX_LEGEND = 20
# Values spanning more than this factor are drawn on a log scale.
SPREAD_FOR_LOG = 100


def plot_curves(runs: Sequence[Run], path: Path) -> Path:
    """Draw each run's ``val/loss`` and ``val/acc`` by epoch (from 0, as everywhere) into ``path``."""
    plt = _pyplot()
    figure, panels = plt.subplots(1, len(CURVES), figsize=(12, 4.5))
    for axes, (column, title) in zip(panels, CURVES, strict=True):
        for run in runs:
            points = sorted(full_history(run).get(column, {}).items())
            if points:
                epochs, values = zip(*points, strict=True)
                axes.plot(epochs, values, marker="o", markersize=3, label=run.name)
        axes.set(title=title, xlabel=EPOCH_AXIS, ylabel=column)
        values = [value for line in axes.lines for value in line.get_ydata() if math.isfinite(value)]
        if values and min(values) > 0 and max(values) > SPREAD_FOR_LOG * min(values):
            axes.set_yscale("log")  # one run's loss in the thousands would flatten every other run's
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(alpha=0.3)
    lines = panels[-1].lines
    if lines and len(lines) <= MAX_LEGEND:
        panels[-1].legend(fontsize=7)
    return _save(figure, path)
