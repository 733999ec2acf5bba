"""Finding the runs below a folder, and reading each as data: its settings, metrics, status and evaluations.

A run folder holds ``config.yaml`` and ``metrics.csv`` or ``run.json``; folders under its ``validate/``, ``test/``
or ``predict/`` are its evaluations. Links to folders are not followed, and a file that links out of the folder
listed is not read. Each file is read bounded, only when it is a plain file: ``config.yaml`` by ``config_files``,
never importing what it names. A file that cannot be read becomes a note on its run's row.
"""

import contextlib
import csv
import io
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ..config_files import check_yaml
from ..errors import UserError, first_line
from ..files import open_regular
from ..metric_logs import epoch_columns
from ..passwords import scrubbed
from ..run_record import ENDINGS, FINISHED, INTERRUPTED, RUN_FILE, RUNNING, process_alive
from ..stores import STUDY_FILE

CONFIG_FILE, METRICS_FILE = "config.yaml", "metrics.csv"
EVALUATIONS = ("validate", "test", "predict")
FINISHED_ONLY = ("loss.png", "confusion_matrix.csv")  # what fit ending well left, before run.json
# run.json and study.json are a few lines; metrics.csv grows a row per logging call.
MAX_RECORD_BYTES, MAX_METRICS_BYTES = 1 << 20, 64 << 20
MAX_EPOCH = 10**9  # a larger epoch number is not one Lightning wrote
DEFAULT_MONITOR = ("val/acc", "max")  # what a project's best checkpoint was before run.json named its monitor
# Settings that say where a run wrote, not how it trained (a resumed run's ckpt_path: its note says which it resumes).
NOT_HYPERPARAMETERS = ("trainer.logger", "trainer.default_root_dir", "trainer.enable_progress_bar", "predictions")
NOT_HYPERPARAMETERS += ("ckpt_path",)
UNREADABLE, UNKNOWN = "unreadable", "unknown"


@dataclass
class Run:
    """One run folder as read: what the table shows of it."""

    folder: Path  # the folder listed joined with the run's place in it
    name: str  # its place in the folder listed
    settings: dict[str, Any] = field(default_factory=dict)  # config.yaml, flattened to the command line's names
    history: dict[str, dict[int, float]] = field(default_factory=dict)  # {metric: {epoch: value}}
    record: dict[str, Any] | None = None  # run.json
    status: str = UNKNOWN
    started: datetime | None = None
    duration_s: float | None = None
    best_checkpoint: str | None = None
    test: dict[str, float] = field(default_factory=dict)
    evaluations: list[tuple[str, Path]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    earlier: "Run | None" = None  # the run this one resumed


def find_folders(root: Path) -> tuple[list[Run], list[Path], list[str]]:
    """The runs below ``root`` (their evaluations attached, nothing read yet), the sweep folders, and notes."""
    runs: list[Run] = []
    sweeps, notes = [], []
    inside = root.resolve()
    below: dict[Path, tuple[Run, str]] = {}  # a folder in a run's evaluation: that run, and the kind of evaluation

    def unlisted(err: OSError) -> None:
        notes.append(f"{err.filename} cannot be listed ({first_line(err)})")

    # os.walk enters no link to a folder: those leading out of root are noted, the others are listed where they are.
    for current, folders, files in os.walk(root, onerror=unlisted):
        folder = Path(current)
        owner, evaluation = below.pop(folder, (None, None))
        names = {*folders, *files}
        is_run = evaluation is None and CONFIG_FILE in names and (METRICS_FILE in names or RUN_FILE in names)
        if evaluation is not None and METRICS_FILE in names:
            owner.evaluations.append((evaluation, folder))
        elif is_run:
            owner = Run(folder=folder, name=relative(folder, root))
            runs.append(owner)
        if STUDY_FILE in names and evaluation is None:
            sweeps.append(folder)
        folders.sort()
        for name in folders:
            path = folder / name
            if path.is_symlink():
                if not _within(path, inside):
                    notes.append(f"{path} links to {os.path.realpath(path)}, outside {root}: not followed")
            elif is_run and name in EVALUATIONS:
                below[path] = (owner, name)
            elif evaluation is not None:
                below[path] = (owner, evaluation)
        folders[:] = [name for name in folders if name != "checkpoints"]
    runs.sort(key=lambda run: _natural(run.name))
    sweeps.sort(key=lambda folder: _natural(folder.as_posix()))
    return runs, sweeps, notes


def read_run(run: Run, root: Path) -> None:
    """Fill ``run`` from its folder; what cannot be read becomes a note, never an exception."""
    run.settings = _read(run, CONFIG_FILE, _settings, root) or {}
    if os.path.lexists(run.folder / METRICS_FILE):
        run.history = _read(run, METRICS_FILE, _metrics, root, MAX_METRICS_BYTES) or {}
    _read_status(run, root)
    tests = [folder for kind, folder in run.evaluations if kind == "test"]
    if tests:  # the test metrics of its latest test (the highest test/version_N)
        latest = max(tests, key=lambda folder: _natural(folder.name))
        name = f"{relative(latest, run.folder)}/{METRICS_FILE}"
        log = _read(run, name, _metrics, root, MAX_METRICS_BYTES) or {}
        run.test = {column: log[column][max(log[column])] for column in epoch_columns(log, "test")}


def _read(run: Run, name: str, parse: Callable[[str], Any], root: Path, limit: int = MAX_RECORD_BYTES) -> Any:
    """What ``parse`` makes of the text of the run's file ``name`` (``read_text``); None, and a note on the run
    saying why, where it cannot be read or parsed."""
    try:
        return parse(read_text(run.folder / name, root, limit))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError, csv.Error, RecursionError, UserError) as err:
        run.notes.append(f"{name} unreadable: {first_line(err)}")
        return None


def _record(text: str) -> dict[str, Any]:
    """``run.json``, with its start as a time (local, if it has no offset); ValueError where it is no run record."""
    record = json.loads(text)
    if not isinstance(record, dict) or record.get("status") not in (*ENDINGS, RUNNING):
        raise ValueError("not a run record")
    return {**record, "started": datetime.fromisoformat(record["started"]).astimezone()}


def _read_status(run: Run, root: Path) -> None:
    folder = run.folder
    if not os.path.lexists(folder / RUN_FILE):  # a run from before run.json: its files tell what they can
        checkpoints = folder / "checkpoints"
        if (checkpoints / "on_exception.ckpt").exists():
            run.status = INTERRUPTED
        elif (checkpoints / "last.ckpt").exists() and any((folder / name).exists() for name in FINISHED_ONLY):
            run.status = FINISHED
        run.notes.append(f"no {RUN_FILE}: status and times from its files")
        with contextlib.suppress(OSError):
            start, end = ((folder / name).stat().st_mtime for name in (CONFIG_FILE, METRICS_FILE))
            run.started = datetime.fromtimestamp(start).astimezone()
            run.duration_s = max(0.0, end - start)
        return
    if (record := _read(run, RUN_FILE, _record, root)) is None:
        run.status = UNREADABLE
        return
    run.record, run.status, run.started = record, record["status"], record["started"]
    if run.status == RUNNING:
        alive = process_alive(record)
        if alive is None:
            run.status = UNKNOWN
            run.notes.append(f"recorded as running on {record.get('host')}: cannot be checked from here")
        elif not alive:
            run.status = INTERRUPTED
            run.notes.append("killed: its process ended without recording how")
        else:
            run.duration_s = (datetime.now().astimezone() - run.started).total_seconds()
    duration = record.get("duration_s")
    if isinstance(duration, int | float) and not isinstance(duration, bool) and math.isfinite(duration):
        run.duration_s = float(duration)
    if record.get("error"):
        run.notes.append(scrubbed(str(record["error"]))[:200])
    best = record.get("best_checkpoint")
    run.best_checkpoint = str(best) if best else None
    with contextlib.suppress(OSError, ValueError):  # a name no file can have (a NUL in it, too long)
        recorded = Path(run.best_checkpoint or "")
        here = folder / "checkpoints" / recorded.name  # the recorded file found from here, where it is in this folder
        if recorded.parent.name == "checkpoints" and here.is_file():
            run.best_checkpoint = str(here)


def monitor_of(run: Run) -> tuple[str, str] | None:
    """The metric and direction (``max`` or ``min``) by which the run chose its best checkpoint, as its run.json
    records them (``"monitor": null``: none); for a run that recorded none, ``DEFAULT_MONITOR`` where it logged it."""
    record = run.record or {}
    monitor, mode = record.get("monitor"), record.get("mode")
    if isinstance(monitor, str) and mode in ("max", "min"):
        return monitor, mode
    if "monitor" in record:
        return None
    return DEFAULT_MONITOR if DEFAULT_MONITOR[0] in full_history(run) else None


def full_history(run: Run) -> dict[str, dict[int, float]]:
    """The run's metrics by epoch after those of the runs it resumed: for an epoch in both, the later run's."""
    chain = [run]
    while chain[-1].earlier is not None and all(chain[-1].earlier is not each for each in chain):
        chain.append(chain[-1].earlier)
    history: dict[str, dict[int, float]] = {}
    for each in reversed(chain):
        for column, values in each.history.items():
            history[column] = {**history.get(column, {}), **values}
    return history


def best_epoch(run: Run) -> tuple[int | None, dict[str, float], str | None]:
    """The epoch with the best monitored value (the first, on a tie), its validation metrics, and None; for a run
    that monitors no metric or never logged it, the last validated epoch, its metrics, and a note that says so."""
    history = full_history(run)
    validation = epoch_columns(history, "val")
    monitor = monitor_of(run)
    scores = {e: value for e, value in history.get(monitor[0], {}).items() if not math.isnan(value)} if monitor else {}
    if scores:
        sign = 1 if monitor[1] == "max" else -1
        epoch, why = max(sorted(scores), key=lambda e: sign * scores[e]), None
    else:
        epoch = max((epoch for column in validation for epoch in history[column]), default=None)
        why = "no monitored metric" if monitor is None else f"{monitor[0]} (monitored) not logged"
    if epoch is None:
        return None, {}, None
    metrics = {column: history[column][epoch] for column in validation if epoch in history[column]}
    return epoch, metrics, why and f"{why}: the last validated epoch's metrics"


def checkpoint_file(run: Run, epoch: int | None, last: bool) -> str | None:
    """The run's recorded best checkpoint; else the one in its folder: ``last.ckpt`` where it shows its ``last``
    validated epoch (it monitors nothing), ``best-epoch=<epoch>-...`` where it shows its best."""
    if run.best_checkpoint:
        return run.best_checkpoint
    checkpoints = run.folder / "checkpoints"
    if last:
        return str(checkpoints / "last.ckpt") if (checkpoints / "last.ckpt").is_file() else None
    found = sorted(checkpoints.glob(f"best-epoch={epoch}-*.ckpt")) if epoch is not None else []
    return str(found[-1]) if found else None


def link_resumed(runs: list[Run]) -> None:
    """Give each resumed run the listed run it continues (from its record or its config's ``ckpt_path``)."""
    by_folder = {_resolved(run.folder): run for run in runs}
    for run in runs:
        resumed = (run.record or {}).get("resumed_from") or run.settings.get("ckpt_path")
        if not isinstance(resumed, str):
            continue
        cwd = (run.record or {}).get("cwd")
        checkpoint = Path(cwd, resumed) if isinstance(cwd, str) else Path(resumed)
        earlier = by_folder.get(_resolved(checkpoint.parent.parent))
        if earlier is not None and earlier is not run:
            run.earlier = earlier
            run.notes.append(f"resumes {earlier.name}")
            earlier.notes.append(f"resumed by {run.name}")


def flatten(config: Any) -> dict[str, Any]:
    """``config.yaml`` as ``{"model.lr": 0.001, "data": "pkg.data.images.ImageDataModule", ...}``: the command
    line's names (``data.batch_size`` for a class's ``init_args``), lists as text. ValueError for no mapping."""
    if not isinstance(config, dict):
        raise ValueError("not a mapping of settings")
    flat: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value and set(value) <= {"class_path", "init_args", "dict_kwargs"}:
            flat[key] = str(value.get("class_path"))
            arguments = [value.get(name) or {} for name in ("init_args", "dict_kwargs")]
            if not all(isinstance(part, dict) for part in arguments):
                raise ValueError(f"{key}: init_args that are no mapping")
            value = {**arguments[0], **arguments[1]}
        if isinstance(value, dict):
            for name, item in value.items():
                walk(item, f"{key}.{name}" if key else str(name))
        elif isinstance(value, list):  # in one line, as YAML writes it: [1, 2, null]
            flat[key] = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=math.inf).strip()
        else:
            flat[key] = value

    walk(config, "")
    return {key: value for key, value in flat.items() if not key.startswith(NOT_HYPERPARAMETERS)}


def _settings(text: str) -> dict[str, Any]:
    """``config.yaml``, bounded as the command line bounds a configuration (``config_files``), flattened."""
    check_yaml(text, CONFIG_FILE)
    return flatten(yaml.safe_load(text))


def _metrics(text: str) -> dict[str, dict[int, float]]:
    """A CSVLogger's ``metrics.csv``: ``{column: {epoch: its last value there}}``, without a last line that has no
    newline yet (being written). ValueError names the line that is no metrics row."""
    epochs: dict[str, dict[int, float]] = {}
    for line, row in enumerate(csv.DictReader(io.StringIO(text[: text.rfind("\n") + 1])), start=2):
        if not row.get("epoch"):
            continue
        try:
            epoch = float(row["epoch"])
            if not (math.isfinite(epoch) and epoch.is_integer() and 0 <= epoch <= MAX_EPOCH):
                raise ValueError(f"epoch {row['epoch']!r} is not an epoch number, a whole number from 0 to {MAX_EPOCH}")
            for column, value in row.items():
                if value and isinstance(column, str) and column not in ("epoch", "step"):
                    epochs.setdefault(column, {})[int(epoch)] = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"line {line} is not a metrics row ({err})") from None
    return epochs


def read_text(path: Path, root: Path, limit: int = MAX_RECORD_BYTES) -> str:
    """The text of ``path``, when it is a plain file of at most ``limit`` bytes and no link out of ``root``: a run
    folder's file is not read from elsewhere."""
    if path.is_symlink() and not _within(path, root.resolve()):
        raise ValueError(f"it links outside {root}: not read")
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"over {limit >> 20} MiB")
    return data.decode("utf-8")


def _within(path: Path, inside: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(inside)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return path


def relative(folder: Path, root: Path) -> str:
    """``folder``'s place in ``root``, as the table names it: ``lightning_logs/version_0``, or ``.``."""
    return folder.relative_to(root).as_posix() if folder != root else "."


def _natural(name: str) -> list:
    """``version_10`` after ``version_9``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
