"""The study itself: created once by whichever worker comes first, with the settings every later worker must share."""

import json
import shlex
import time
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import RDBStorage

from ..errors import ConfigError
from .store import shown

SETTINGS = "sweep"
# How long a worker waits for the worker that is creating the study to record its settings.
CREATION_WAIT_S = 60


def open_study(
    name: str,
    storage: RDBStorage,
    url: str,
    settings: dict[str, Any],
    grid: list[dict[str, Any]],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
) -> optuna.Study:
    """The study ``name``: created with ``settings`` and the trials of ``grid`` queued, or loaded and checked.

    Creating is atomic in the store: of two workers started at once, one creates the study
    and queues its grid, and the other waits for its settings, so the grid is queued once.
    A study started with other settings (train.py's arguments, the space, the sampler) is
    refused in one line: its trials would not be comparable.
    """
    settings = json.loads(json.dumps(settings))  # as the store gives it back: lists, not tuples
    direction = settings["direction"]
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=direction, sampler=sampler, pruner=pruner
        )
    except DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    else:
        for params in grid:
            study.enqueue_trial(params)
        study.set_user_attr(SETTINGS, settings)
        return study
    deadline = time.monotonic() + CREATION_WAIT_S
    while (recorded := study.user_attrs.get(SETTINGS)) is None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"study {name} in {shown(url)} has no settings: the process creating it stopped first; "
                "give another --study"
            )
        time.sleep(1)
    differing = [key for key in settings if recorded.get(key) != settings[key]]
    if differing:
        raise ConfigError(
            f"study {name} in {shown(url)} was started with other {' and '.join(_SHOWN.get(k, k) for k in differing)}"
            f" ({'; '.join(_then(recorded.get(k)) for k in differing)}): continue it with the same, "
            "or give --study a new name for a new study"
        )
    return study


def _then(value: Any) -> str:
    return f"then: {shlex.join(value) if isinstance(value, list) else value}"


_SHOWN = {"train_args": "train.py arguments", "space": "search space", "monitor": "monitored metric"}
