"""The validation curves of the runs listed, in one figure: a line per run, by epoch.

A panel of the validation loss, and one of the metric each run monitored (from its
run.json), or, for a run that monitors none or the loss, its first validation metric that
is no loss. Runs that chose different metrics get a panel each (up to ``MAX_METRIC_PANELS``);
each panel's title names its metric. A run keeps its colour in every panel.
"""

from collections.abc import Sequence
from pathlib import Path

from ..metric_logs import MetricLog, parse_name
from ..plots import EPOCH_AXIS, _pyplot, _save, drawable
from .folders import Run, full_log, monitor_of

# More lines than this make a legend that hides the curves: the runs are then named in the table only.
MAX_LEGEND = 20
# Values spanning more than this factor are drawn on a log scale.
SPREAD_FOR_LOG = 100
# Panels of metrics beside the loss's, at most: runs that chose more metrics than this are drawn in the loss's only.
MAX_METRIC_PANELS = 4


def plot_curves(runs: Sequence[Run], path: Path, notes: list[str] | None = None) -> Path:
    """Draw each run's validation loss and monitored (else first) validation metric by epoch (from 0, as
    everywhere) into ``path``; what is left out is said in ``notes``, where given."""
    logs = [full_log(run) for run in runs]
    losses = [_validation_loss(log) for log in logs]
    chosen = [_metric_of(run, log, loss) for run, log, loss in zip(runs, logs, losses, strict=True)]
    panels: dict[str, list[int]] = {}  # metric -> the runs (by position) drawn in its panel
    for index, choice in enumerate(chosen):
        if choice is not None:
            panels.setdefault(choice[0], []).append(index)
    if len(panels) > MAX_METRIC_PANELS and notes is not None:
        left = list(panels)[MAX_METRIC_PANELS:]
        notes.append(f"{path}: the curves of {', '.join(left)} are not drawn (at most {MAX_METRIC_PANELS} metrics)")
    metrics = list(panels)[:MAX_METRIC_PANELS]
    plt = _pyplot()
    figure, axes_list = plt.subplots(1, 1 + len(metrics), figsize=(6 * (1 + len(metrics)), 4.5), squeeze=False)
    loss_axes, *metric_axes = axes_list[0]
    for index, (run, log, loss) in enumerate(zip(runs, logs, losses, strict=True)):
        if loss is not None:
            _line(loss_axes, log, loss, run.name, index)
    loss_names = _ordered(loss for loss in losses if loss is not None)
    # The loss's title says it is monitored when every run drawn in it monitors it, the same way.
    hows = {_loss_monitored(run, loss) for run, loss in zip(runs, losses, strict=True) if loss is not None}
    title = "Validation loss" + (f" ({hows.pop()})" if len(hows) == 1 and None not in hows else "")
    _finish(loss_axes, title, " / ".join(loss_names) or "val/loss")
    for axes, metric in zip(metric_axes, metrics, strict=True):
        for index in panels[metric]:
            _line(axes, logs[index], metric, runs[index].name, index)
        _finish(axes, _title(metric, [chosen[index][1] for index in panels[metric]]), metric)
    handles = {line.get_label(): line for axes in axes_list[0] for line in axes.lines}
    if handles and len(handles) <= MAX_LEGEND:
        axes_list[0][-1].legend(list(handles.values()), list(handles), fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(figure, path)


def _validation_loss(log: MetricLog) -> str | None:
    """The column of the run's validation loss (``val/loss``, ``val_loss``, ...), if it logged one."""
    return next((column for column in log.epoch_columns("val") if parse_name(column).metric == "loss"), None)


def _metric_of(run: Run, log: MetricLog, loss: str | None) -> tuple[str, str] | None:
    """The metric of the run's second panel, and how it was chosen: the monitored one (unless it is the validation
    loss, drawn already), else the first validation metric that is no loss."""
    monitor = monitor_of(run)
    if monitor is not None and monitor[0] in log.epochs and monitor[0] != loss:
        return monitor[0], f"monitored, {monitor[1]}"
    first = next((c for c in log.epoch_columns("val") if parse_name(c).metric != "loss"), None)
    return None if first is None else (first, "first validation metric")


def _title(metric: str, hows: list[str]) -> str:
    """``val/mae (monitored, min)``, ``val/r2 (first validation metric)``; ``val/mae (monitored in 2 of 3 runs)``
    when its runs chose it in different ways."""
    if len(set(hows)) == 1:
        return f"{metric} ({hows[0]})"
    return f"{metric} (monitored in {sum(how.startswith('monitored') for how in hows)} of {len(hows)} runs)"


def _loss_monitored(run: Run, loss: str) -> str | None:
    """``monitored, min`` when the run monitors its validation loss ``loss``; else None."""
    monitor = monitor_of(run)
    return f"monitored, {monitor[1]}" if monitor is not None and monitor[0] == loss else None


def _line(axes, log: MetricLog, column: str, label: str, index: int) -> None:
    points = sorted((epoch, value) for epoch, value in log.epochs.get(column, {}).items() if drawable(value))
    if points:
        epochs, values = zip(*points, strict=True)
        axes.plot(epochs, values, marker="o", markersize=3, label=label, color=f"C{index % 10}")


def _finish(axes, title: str, ylabel: str) -> None:
    axes.set(title=title, xlabel=EPOCH_AXIS, ylabel=ylabel)
    values = [value for line in axes.lines for value in line.get_ydata()]
    if values and min(values) > 0 and max(values) > SPREAD_FOR_LOG * min(values):
        axes.set_yscale("log")  # one run's loss in the thousands would flatten every other run's
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(alpha=0.3)


def _ordered(items) -> list[str]:
    return list(dict.fromkeys(items))
