"""Cross-validation folds: the training and validation data split into K stratified, disjoint folds by a seed.

With ``--data.folds K --data.fold i`` an in-memory data module validates on fold ``i`` and
trains on the other ``K - 1``; the test split is never part of the folds.
"""

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError


def check_folds(folds: int | None, fold: int, val_fraction: float, default_val_fraction: float) -> None:
    """Refuse fold arguments that do not go together, naming their flags: a ``fold`` past the ``folds``, or without
    them, and a ``val_fraction`` given with folds (``default_val_fraction``: the module's default), where the fold
    validates. Each one alone is bounded by its type (``arguments.Folds``, ``arguments.Fold``)."""
    if folds is None and fold != 0:
        raise ConfigError(
            f"--data.fold picks the validation fold: give --data.folds too, the number of folds (at least 2), "
            f"got {fold!r}"
        )
    if folds is not None and fold >= folds:
        raise ConfigError(
            f"--data.fold must be from 0 to {folds - 1}, one of the --data.folds {folds} folds, got {fold!r}"
        )
    if folds is not None and val_fraction != default_val_fraction:
        raise ConfigError(
            f"--data.val_fraction does not apply with --data.folds, where the fold --data.fold is the validation set: "
            f"leave it out, got {val_fraction!r}"
        )


def fold_split(
    labels: np.ndarray, folds: int, fold: int, seed: int, class_names: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the training samples (every fold but ``fold``) and of the validation samples (``fold``).

    The samples are ordered by class, randomly within each class, and dealt to the folds in turn: each class's
    count differs by at most one between folds, and so do the folds' sizes. Refused, naming the class, when a class
    has fewer samples than there are folds: each fold must hold every class the data has.
    """
    labels = np.asarray(labels)
    present, counts = np.unique(labels, return_counts=True)
    if len(present) and counts.min() < folds:
        smallest = present[counts.argmin()]
        name = class_names[smallest] if class_names is not None else str(smallest)
        raise ConfigError(
            f"--data.folds {folds} is more than the {counts.min()} training and validation sample(s) of class "
            f"{name!r}: each fold needs one of each class, so choose at most {counts.min()} folds, or add data"
        )
    # RandomState: NumPy keeps its stream fixed across versions and machines (NEP 19), so a run
    # evaluated later, anywhere, gets its fold back.
    shuffled = np.random.RandomState(seed).permutation(len(labels))
    order = np.lexsort((shuffled, labels))  # by label, then by the random rank
    assigned = np.empty(len(labels), dtype=np.int64)
    assigned[order] = np.arange(len(labels)) % folds
    return np.flatnonzero(assigned != fold), np.flatnonzero(assigned == fold)
