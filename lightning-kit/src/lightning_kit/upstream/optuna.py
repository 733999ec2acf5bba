"""Optuna's private names the library relies on."""

import optuna
from optuna.trial import FrozenTrial, Trial

from . import Private


def _trial_id_of_an_asked_trial() -> int:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    study.tell(trial, 0.0)
    return trial_id(trial) + trial_id(study.trials[0])  # both kinds: a running Trial and a FrozenTrial


PRIVATES = (
    Private(
        "optuna.trial.Trial._trial_id",
        "the storage's id of a trial (of a Trial and a FrozenTrial), which the sweeps' queue and heartbeat pass to the "
        "storage: Optuna says a trial by its number, which is the study's, not the storage's",
        "optuna 4.9.0 to 5.0.0",
        _trial_id_of_an_asked_trial,
        int,
    ),
)


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of ``trial``."""
    return trial._trial_id
