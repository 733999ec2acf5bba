"""The study itself: created once by whichever worker comes first, with the settings every later worker must share."""

import json
import time
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import RDBStorage

from ..errors import ConfigError
from ..passwords import hidden
from .fingerprint import differences

SETTINGS = "sweep"
CREATION_WAIT_S = 60  # how long a worker waits for the one creating the study to record its settings
# What defines a study, compared when it is continued: what it trains with and on, what it searches, how it judges.
COMPARED = ("config", "data", "space", "sampler", "monitor", "direction")
_SHOWN = {
    "train_args": "other train.py arguments",
    "config": "other training arguments",
    "space": "another search space",
    "monitor": "another monitored metric",
}


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

    Creating is atomic in the store: of two workers started at once, one creates the study and queues its grid, the
    other waits for its settings, so the grid is queued once. A study started with other ``COMPARED`` settings is
    refused (``StudyDiffersError``): its trials would not be comparable.
    """
    settings = json.loads(json.dumps(settings, default=str))  # as the store gives it back: lists, not tuples
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=settings["direction"], sampler=sampler, pruner=pruner
        )
    except DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    else:
        for params in grid:
            study.enqueue_trial(params)
        # The metric by its name in Optuna's dashboard and plots, not "Objective 0" (experimental: main ignores that).
        study.set_metric_names([settings["monitor"]])
        study.set_user_attr(SETTINGS, settings)
        return study
    deadline = time.monotonic() + CREATION_WAIT_S
    while (recorded := study.user_attrs.get(SETTINGS)) is None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"study {name} in {hidden(url)} has no settings: the process creating it stopped first; "
                "give --new_study (or another --study) for a new study"
            )
        time.sleep(1)
    # A study recorded before the configuration was is compared by its arguments as given.
    compared = [key for key in COMPARED if key in recorded] + ([] if "config" in recorded else ["train_args"])
    differing = [key for key in compared if recorded.get(key) != settings.get(key)]
    if differing:
        what = " and ".join(_changed(key, recorded.get(key), settings.get(key)) for key in differing)
        raise StudyDiffersError(
            f"study {name} in {hidden(url)} was started with {what}: continue it with the same, "
            "or give --new_study to start a new study beside it (or --study NAME)",
            what,
        )
    return study


class StudyDiffersError(ConfigError):
    """The study of that name was started with other settings (``what``): its trials would not be comparable."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


def _changed(key: str, then: Any, now: Any) -> str:
    """What changed in the setting ``key``, for a person: ``another search space (model.lr: then ..., now ...)``."""
    if key == "data":
        then, now = (_samples(data) for data in (then, now))
        return f"other data (then: {then}; now: {now})"
    changes = differences(then, now)
    shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
    return f"{_SHOWN.get(key, f'another {key}')} ({shown})"


def _samples(data: Any) -> str:
    """A data fingerprint for a person: ``5400 training and 600 validation samples, digest 1a2b3c4d``."""
    if not isinstance(data, dict):
        return str(data)
    return f"{data.get('train')} training and {data.get('val')} validation samples, digest {data.get('digest')!s:.12}"
