"""A sweep's study, read from its store: each trial's state, and each parameter's importance.

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
import statistics
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import stores
from ..errors import UserError
from ..passwords import hidden, scrubbed, unescaped_at
from .folders import STUDY_FILE, Run, read_text

STUDY_DB = "study.db"
# Reading a study: how long to wait for a worker's write lock, and for any one query (a schema may loop).
READ_LOCK_WAIT_S = 5
READ_STATEMENT_LIMIT_S = 5
_TRIAL = re.compile(r"trial_(\d+)")
# A cross-validation's only parameter (``sweep --folds K``): its trials are folds to average, not settings to rank.
FOLD_PARAMETER = "data.fold"
# Importances from fewer complete trials than this are weak evidence, and said to be next to the numbers.
FIRM_IMPORTANCE_TRIALS = 20


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
    storage: Any = None  # its store, opened read-only (an optuna RDBStorage)
    url: str | None = None  # the store's URL
    complete: int = 0  # how many trials are complete
    folds: int | None = None  # a cross-validation's number of folds; None for a search over settings
    fold_choices: list = field(default_factory=list)  # its folds, as data.fold names them
    fold_trials: dict[int, int] = field(default_factory=dict)  # fold -> its complete trial's number
    values: dict[int, float] = field(default_factory=dict)  # a complete trial's number -> its monitored value

    def summary(self, runs: Sequence[Run] = ()) -> list[str]:
        """Lines for below the table: the study, its trials by state, and each parameter's importance, or for a
        cross-validation the folds' mean and spread (of the trials' ``runs``' test metrics too)."""
        about = [f"study {self.study_name}"]
        if self.folds is not None:
            about.append(f"cross-validation over {self.folds} folds")
        if self.monitor and self.direction:
            about.append(f"{self.direction} {self.monitor}")
        counts = Counter(self.states.values())
        trials = "".join(f", {count} {state}" for state, count in sorted(counts.items()))
        lines = [f"sweep {self.name} ({', '.join(about)}): {len(self.states)} trials{trials}"]
        if self.folds is not None:
            lines += self._fold_lines(runs)
        elif self.importances:
            ranked = sorted(self.importances.items(), key=lambda item: -item[1])
            weak = f": weak evidence, {FIRM_IMPORTANCE_TRIALS} or more are firmer"
            weight = f"from {self.complete} complete trials{weak if self.complete < FIRM_IMPORTANCE_TRIALS else ''}"
            lines.append(
                f"  importance ({self.method}; {weight}): " + ", ".join(f"{name} {value:.2f}" for name, value in ranked)
            )
        lines += [f"  note: {note}" for note in self.notes]
        return lines

    def _fold_lines(self, runs: Sequence[Run]) -> list[str]:
        """Each metric's mean and spread over the folds: the monitored one from the study, the test ones from
        the folds' run folders (a test of each fold's checkpoint)."""
        missing = sorted(set(self.fold_choices) - set(self.fold_trials), key=_in_order)
        per_metric: dict[str, dict[int, float]] = {}
        if self.monitor:
            per_metric[f"{self.monitor} (monitored)"] = {
                fold: self.values[number] for fold, number in self.fold_trials.items() if number in self.values
            }
        fold_of = {number: fold for fold, number in self.fold_trials.items()}
        for run in runs:
            trial = trial_of(run, [self])
            if trial is None or trial[0] not in fold_of:
                continue
            for name, value in run.test.items():
                per_metric.setdefault(name, {})[fold_of[trial[0]]] = value
        lines = [f"  folds complete: {len(self.fold_trials)} of {self.folds}"]
        if missing:
            # A mean without them would be of other data.
            lines[0] += f"; no mean until folds {', '.join(map(str, missing))} complete (run the same command again)"
        for name, by_fold in per_metric.items():
            values = [by_fold[fold] for fold in sorted(by_fold, key=_in_order)]
            each = ", ".join(f"{fold}: {by_fold[fold]:.4f}" for fold in sorted(by_fold, key=_in_order))
            if not values:
                continue
            if missing or len(values) < len(self.fold_trials):
                lines.append(f"  {name} by fold: {each} (over {len(values)} of {self.folds} folds: no mean)")
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            lines.append(
                f"  {name}: mean {statistics.mean(values):.4f}, standard deviation {spread:.4f} "
                f"over {len(values)} folds (min {min(values):.4f}, max {max(values):.4f}; by fold {each})"
            )
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
    url, database = _storage(folder, root, storage)
    if url is None:
        # A URL in a folder is data: it never makes this command connect anywhere.
        recorded = _text(info.get("storage"))
        where = hidden(recorded) if recorded else "another store"
        sweep.notes.append(f"the study is in {where}, not {STUDY_DB} here: give --storage URL")
        return sweep
    if unescaped_at(url):
        sweep.notes.append(f"{hidden(url)} holds more than one '@': write an '@' in its password as %40")
        return sweep
    if database is not None:
        try:
            stores.check_sqlite_file(database, hidden(url), writing=False)
        except UserError as err:
            sweep.notes.append(f"{err}: the study is not read")
            return sweep
        if not Path(database).is_file():
            # SQLite would make an empty file there.
            sweep.notes.append(f"{hidden(url)} is no file: the study is not read")
            return sweep
    _load(sweep, url, database)
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


def _load(sweep: Sweep, url: str, database: str | None) -> None:
    """Read the study from ``url`` (the SQLite file ``database``, opened read-only), every query time-bound."""
    import optuna

    try:
        storage = open_read_only(url, database)
        sweep.study = optuna.load_study(study_name=sweep.study_name, storage=storage)
        trials = sweep.study.get_trials(deepcopy=False)
    except Exception as err:  # a store's failures are many (SQLAlchemy's, Optuna's, the driver's): each is a note
        sweep.study = None
        reason = failure_reason(err)
        journal = Path(f"{database}-journal") if database is not None else None
        if "readonly" in reason.lower() and journal is not None and _size(journal):
            reason = (
                f"a sweep stopped in the middle of a write, and its {journal.name} is there to undo it: run the "
                f"sweep again (it recovers the file), then list; the table only reads ({reason})"
            )
        elif "readonly" in reason.lower():  # Optuna writes to a study that lacks what it writes: the table never does
            reason = f"it lacks what Optuna writes into every study (and the table opens studies read-only: {reason})"
        else:
            reason = stores.explained(reason)
        sweep.notes.append(f"study {sweep.study_name} cannot be read from {hidden(url)}: {reason}")
        return
    sweep.storage, sweep.url = storage, url
    sweep.states = {trial.number: trial.state.name.lower() for trial in trials}
    complete = [trial for trial in trials if trial.state == optuna.trial.TrialState.COMPLETE]
    sweep.complete = len(complete)
    sweep.values = {trial.number: float(trial.value) for trial in complete if trial.value is not None}
    _read_folds(sweep, trials, complete)
    if sweep.folds is not None:
        return  # the folds' mean and spread are the summary: an importance of the fold would say nothing
    if len(complete) < 2:
        sweep.notes.append("importance needs 2 or more complete trials")
        return
    evaluator = _evaluator()
    sweep.method = "fANOVA" if isinstance(evaluator, optuna.importance.FanovaImportanceEvaluator) else "PED-ANOVA"
    try:
        sweep.importances = optuna.importance.get_param_importances(sweep.study, evaluator=evaluator)
    except (ValueError, RuntimeError) as err:
        sweep.notes.append(f"importance not computed: {_line(err)}")


def open_read_only(url: str, database: str | None):
    """The Optuna store ``url`` (the SQLite file ``database``, if one), opened read-only, every query time-bound."""
    # Imported here: a second or more, and only a listing with a sweep in it needs it.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a store it cannot read is a note, not Optuna's warnings
    if database is not None:
        connect = stores.sqlite_connector(
            database, read_only=True, lock_wait_s=READ_LOCK_WAIT_S, statement_limit_s=READ_STATEMENT_LIMIT_S
        )
        engine_kwargs: dict[str, Any] = {"creator": connect}
    elif url.startswith("postgres"):
        limit = f"-c statement_timeout={READ_STATEMENT_LIMIT_S * 1000} -c default_transaction_read_only=on"
        engine_kwargs = {"connect_args": {"connect_timeout": READ_LOCK_WAIT_S, "options": limit}}
    else:
        engine_kwargs = {}
    # Read only: no tables made in a file that has none. Without Alembic's schema check (a second to import):
    # a store Optuna cannot read fails at its first query.
    return optuna.storages.RDBStorage(
        url, engine_kwargs=engine_kwargs, skip_compatibility_check=True, skip_table_creation=True
    )


def failure_reason(err: BaseException) -> str:
    """The database's own words for ``err`` (Optuna and SQLAlchemy wrap them), in one line without a password."""
    return _line(_origin(err))


def _read_folds(sweep: Sweep, trials: list, complete: list) -> None:
    """Whether the study is a cross-validation (its only parameter is the fold), its folds, and each fold's trial."""
    names = {name for trial in trials for name in {**trial.system_attrs.get("fixed_params", {}), **trial.params}}
    if names != {FOLD_PARAMETER}:
        return
    choices = {
        choice
        for trial in trials
        for choice in getattr(trial.distributions.get(FOLD_PARAMETER), "choices", ())
        or [{**trial.system_attrs.get("fixed_params", {}), **trial.params}.get(FOLD_PARAMETER)]
    }
    sweep.fold_choices = sorted(choices - {None}, key=_in_order)
    sweep.folds = len(sweep.fold_choices)
    for trial in sorted(complete, key=lambda trial: trial.number):  # a fold run again: its latest trial
        if trial.params.get(FOLD_PARAMETER) is not None:
            sweep.fold_trials[trial.params[FOLD_PARAMETER]] = trial.number


def _in_order(value: Any) -> tuple:
    """Numbers by size (fold 2 before fold 10), then anything else as text."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return (0, value, "") if number else (1, 0, str(value))


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


def _storage(folder: Path, root: Path, given: str | None) -> tuple[str | None, str | None]:
    """The study's store and its SQLite file, if one: ``study.db`` beside ``study.json`` when it is a plain file
    inside ``root``, else ``given`` (whose password is remembered, to be hidden wherever it would show)."""
    database = folder / STUDY_DB
    try:
        plain = stat.S_ISREG(database.stat().st_mode)
    except OSError:
        plain = False
    if plain and Path(os.path.realpath(database)).is_relative_to(root.resolve()):
        return f"sqlite:///{database.resolve()}", str(database.resolve())
    if given is None:
        return None, None
    stores.opened(given)
    return given, stores.sqlite_database(given)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _origin(err: BaseException) -> BaseException:
    """The database's own error behind ``err`` (Optuna and SQLAlchemy wrap it), for its message."""
    seen = set()
    while id(err) not in seen and (err.__cause__ is not None or getattr(err, "orig", None) is not None):
        seen.add(id(err))
        err = getattr(err, "orig", None) or err.__cause__
    return err


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _line(err: BaseException) -> str:
    return scrubbed(" ".join(str(err).split()))[:200] or type(err).__name__
