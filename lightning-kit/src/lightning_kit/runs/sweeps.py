"""A sweep's study, read from its store: each trial's state, each parameter's importance, Optuna's plots.

A sweep folder (``runs/sweeps/<study>/``) holds ``study.json`` (the study's name, its
storage's URL without a password, the monitored metric and its direction), the study's
SQLite file ``study.db`` when it is stored there, and one run folder per trial,
``trial_<NNNN>/``. A study stored elsewhere (PostgreSQL) is read from the ``--storage``
given, or from the URL in ``study.json``. Optuna is imported only when a sweep is listed.
"""

import importlib.util
import json
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from .folders import STUDY_FILE, Run, read_text

STUDY_DB = "study.db"
_TRIAL = re.compile(r"trial_(\d+)")


@dataclass
class Sweep:
    """A sweep folder and what its study says."""

    folder: Path
    name: str
    study_name: str = "?"
    monitor: str | None = None
    direction: str | None = None
    states: dict[int, str] = field(default_factory=dict)  # trial number -> complete, pruned, fail, running, ...
    importances: dict[str, float] = field(default_factory=dict)
    method: str = ""  # how the importances were computed
    notes: list[str] = field(default_factory=list)
    study: Any = None  # the optuna.Study, when it could be loaded

    def summary(self) -> list[str]:
        """Lines for below the table: the study, its trials by state, each parameter's importance."""
        goal = f", {self.direction} {self.monitor}" if self.monitor and self.direction else ""
        counts: dict[str, int] = {}
        for state in self.states.values():
            counts[state] = counts.get(state, 0) + 1
        trials = "".join(f", {count} {state}" for state, count in sorted(counts.items()))
        lines = [f"sweep {self.name} (study {self.study_name}{goal}): {len(self.states)} trials{trials}"]
        if self.importances:
            ranked = sorted(self.importances.items(), key=lambda item: -item[1])
            lines.append(f"  importance ({self.method}): " + ", ".join(f"{name} {value:.2f}" for name, value in ranked))
        lines += [f"  note: {note}" for note in self.notes]
        return lines


def read_sweep(folder: Path, name: str, root: Path, storage: str | None) -> Sweep:
    """The sweep in ``folder``: its ``study.json``, and its study, from ``study.db`` beside it or else ``storage``."""
    sweep = Sweep(folder=folder, name=name)
    try:
        info = json.loads(read_text(folder / STUDY_FILE, root))
        if not isinstance(info, dict) or not isinstance(info.get("study_name"), str):
            raise ValueError("no study_name")
    except (OSError, ValueError, RecursionError, UserError) as err:
        sweep.notes.append(f"{STUDY_FILE} unreadable: {_line(err)}")
        return sweep
    sweep.study_name = info["study_name"]
    sweep.monitor, sweep.direction = _text(info.get("monitor")), _text(info.get("direction"))
    url = _storage(folder, root, storage)
    if url is None:
        # A URL in a folder is data: it never makes this command connect anywhere.
        recorded = _text(info.get("storage"))
        sweep.notes.append(f"the study is in {recorded or 'another store'}, not {STUDY_DB} here: give --storage URL")
        return sweep
    if url.startswith("sqlite:") and not Path(url.partition(":///")[2]).is_file():
        # SQLite would make an empty file there.
        sweep.notes.append(f"{url} is no file: the study is not read")
        return sweep
    _load(sweep, url)
    return sweep


def trial_of(run: Run, sweeps: list[Sweep]) -> tuple[int, str] | None:
    """The trial number and state of a run in a sweep folder (``trial_0003/...``), or None."""
    for sweep in sweeps:
        if run.folder.is_relative_to(sweep.folder) and run.folder != sweep.folder:
            match = _TRIAL.fullmatch(run.folder.relative_to(sweep.folder).parts[0])
            if match:
                number = int(match.group(1))
                return number, sweep.states.get(number, "?")
    return None


def plot_sweep(sweep: Sweep, history: Path, importances: Path) -> list[str]:
    """Draw Optuna's optimisation history and parameter importances of ``sweep``; return notes on what was not."""
    import optuna

    from ..plots import _pyplot, _save

    _pyplot()  # Agg: files only
    notes = []
    drawings = optuna.visualization.matplotlib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for path, draw, extra in (
            (history, drawings.plot_optimization_history, {}),
            (importances, drawings.plot_param_importances, {"evaluator": _evaluator()}),
        ):
            try:
                axes = draw(sweep.study, **extra)
            except (ValueError, RuntimeError) as err:
                notes.append(f"{path} not drawn: {err}")
                continue
            _save(axes.figure, path)
    return notes


def _load(sweep: Sweep, url: str) -> None:
    # Imported here: a second or more, and only a listing with a sweep in it needs it.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        # Read only: no tables made in a file that has none. Without Alembic's schema check (a second to import):
        # a store Optuna cannot read fails below, in a note.
        storage = optuna.storages.RDBStorage(url, skip_compatibility_check=True, skip_table_creation=True)
        sweep.study = optuna.load_study(study_name=sweep.study_name, storage=storage)
        trials = sweep.study.get_trials(deepcopy=False)
    except Exception as err:  # a store's failures are many (SQLAlchemy's, Optuna's, the driver's): each is a note
        sweep.notes.append(f"study {sweep.study_name} cannot be read from {_without_password(url)}: {_line(err)}")
        return
    sweep.states = {trial.number: trial.state.name.lower() for trial in trials}
    complete = [trial for trial in trials if trial.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        sweep.notes.append("importance needs 2 or more complete trials")
        return
    evaluator = _evaluator()
    sweep.method = "fANOVA" if isinstance(evaluator, optuna.importance.FanovaImportanceEvaluator) else "PED-ANOVA"
    try:
        sweep.importances = optuna.importance.get_param_importances(sweep.study, evaluator=evaluator)
    except (ValueError, RuntimeError) as err:
        sweep.notes.append(f"importance not computed: {_line(err)}")


def _evaluator():
    """Optuna's own default, fANOVA, where scikit-learn (which it needs) is installed; else PED-ANOVA.

    Seeded: the same numbers at every listing. PED-ANOVA compares the best trials with all of them:
    with few trials, read it as a hint.
    """
    import optuna

    if importlib.util.find_spec("sklearn") is not None:
        return optuna.importance.FanovaImportanceEvaluator(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.importance.PedAnovaImportanceEvaluator()


def _storage(folder: Path, root: Path, given: str | None) -> str | None:
    """The study's store: ``study.db`` beside ``study.json`` when it is a plain file inside ``root``, else ``given``."""
    database = folder / STUDY_DB
    try:
        plain = stat.S_ISREG(database.stat().st_mode)
    except OSError:
        plain = False
    if plain and Path(os.path.realpath(database)).is_relative_to(root.resolve()):
        return f"sqlite:///{database.resolve()}"
    return given


def _without_password(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__
