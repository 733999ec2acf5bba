"""A sweep folder below the table: its trials by status, and a cross-validation's mean and spread over its folds,
from the trials' run folders and the sweep's ``study.json`` alone (the study itself is Optuna's dashboard's)."""

import json
import math
import statistics
from collections import Counter
from pathlib import Path

from ..errors import UserError, first_line
from ..run_record import FINISHED
from ..stores import STUDY_FILE
from .folders import Run, full_history, read_text, relative

FOLD = "data.fold"


def summary(folder: Path, root: Path, runs: list[Run]) -> list[str]:
    """Lines about the sweep in ``folder``, whose trials are among ``runs`` (every status, whatever is listed)."""
    trials = [run for run in runs if run.folder.parent == folder and run.folder.name.startswith("trial_")]
    counts = Counter(run.status for run in trials)
    head = f"sweep {relative(folder, root)}"
    try:
        info = json.loads(read_text(folder / STUDY_FILE, root))
        about = [f"study {info['study_name']}"]
    except (OSError, ValueError, TypeError, KeyError, RecursionError, UserError) as err:
        return [f"{head}: {STUDY_FILE} unreadable: {first_line(err)}"]
    monitor, direction, folds = info.get("monitor"), info.get("direction"), info.get("folds")
    folds = folds if isinstance(folds, int) and not isinstance(folds, bool) and folds > 0 else None
    if folds is not None:
        about.append(f"cross-validation over {folds} folds")
    if isinstance(monitor, str) and direction in ("maximize", "minimize"):
        about.append(f"{direction} {monitor}")
    else:
        monitor = None
    states = "".join(f", {count} {status}" for status, count in sorted(counts.items()))
    lines = [f"{head} ({', '.join(about)}): {len(trials)} trials{states}"]
    if folds is None:
        return [*lines, f"  its study, trial by trial: python -m lightning_kit.views dashboard {folder}"]
    return lines + _fold_lines(trials, folds, monitor, direction)


def _fold_lines(trials: list[Run], folds: int, monitor: str | None, direction: str) -> list[str]:
    """Each metric's mean and spread over the folds: the monitored one's best, and each fold's test metrics. A fold
    run again counts by its latest finished trial."""
    by_fold = {run.settings.get(FOLD): run for run in trials if run.status == FINISHED}
    by_fold = {fold: by_fold[fold] for fold in range(folds) if fold in by_fold}
    per_metric: dict[str, dict[int, float]] = {}
    if monitor:
        best = max if direction == "maximize" else min
        for fold, run in by_fold.items():
            values = [v for v in full_history(run).get(monitor, {}).values() if not math.isnan(v)]
            if values:
                per_metric.setdefault(f"{monitor} (monitored)", {})[fold] = best(values)
    for fold, run in by_fold.items():
        for name, value in run.test.items():
            per_metric.setdefault(name, {})[fold] = value
    missing = [fold for fold in range(folds) if fold not in by_fold]
    lines = [f"  folds complete: {len(by_fold)} of {folds}"]
    if missing:  # a mean without them would be of other data
        lines[0] += f"; no mean until folds {', '.join(map(str, missing))} complete (run the same command again)"
    for name, values in per_metric.items():
        each = ", ".join(f"{fold}: {value:.4f}" for fold, value in sorted(values.items()))
        if len(values) < folds:
            lines.append(f"  {name} by fold: {each} (over {len(values)} of {folds} folds: no mean)")
            continue
        numbers = list(values.values())
        spread = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
        lines.append(
            f"  {name}: mean {statistics.mean(numbers):.4f}, standard deviation {spread:.4f} over {folds} folds "
            f"(min {min(numbers):.4f}, max {max(numbers):.4f}; by fold {each})"
        )
    return lines
