"""Sequence data: a synthetic task in which order matters, or token sequences from a file."""

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning_kit.arguments import BatchSize, Fold, Folds, Fraction, NumClasses, Seed, Workers, check_memory
from lightning_kit.data import DataUnavailableError, InMemoryDataModule, InMemoryDataset
from lightning_kit.data.folds import check_folds, fold_split
from lightning_kit.errors import ConfigError
from lightning_kit.files import NotAFileError, open_regular

# Token ids of the two markers in the synthetic task; every other id is filler.
FIRST_MARKER, SECOND_MARKER = 0, 1
# The validation share held out unless folds say which sequences validate.
VAL_FRACTION = 0.1


class SequenceDataModule(InMemoryDataModule):
    """Fixed-length token sequences with one class label each.

    ``dataset="synthetic"`` generates sequences in which two marker tokens appear
    once each, labelled 1 when marker 0 comes before marker 1 and 0 otherwise: the
    same tokens in another order change the label, so a model must use positions.

    ``dataset="file"`` reads ``path``, an ``.npz`` file (``numpy.savez``) with
    ``tokens``, integer ids of shape ``(N, T)`` in ``[0, vocab_size)`` with ``T`` at
    most ``seq_len``, and ``labels``, integers of shape ``(N,)`` in ``[0, num_classes)``.

    Args:
        dataset: ``"synthetic"`` or ``"file"``.
        path: The ``.npz`` file read when ``dataset="file"``.
        vocab_size: Number of distinct token ids (must match the network's); at least 3 for the synthetic task.
        seq_len: Tokens per sequence (at most the network's ``max_len``); at least 2 for the synthetic task.
        num_classes: Number of labels (must match the network's); at least 2, and 2 for the synthetic task.
        num_sequences: Sequences generated when ``dataset="synthetic"``: enough for a training,
            validation and test sequence each.
        val_fraction: Share of the sequences held out for validation.
        test_fraction: Share of the sequences held out for testing (with ``val_fraction``, below 1).
        batch_size: Sequences per batch, per device.
        num_workers: Loader processes; slicing in-memory tensors needs none.
        seed: Seed of the split and of the synthetic sequences.
        predict_path: What ``predict`` runs on: an ``.npz`` file with ``tokens`` (and, if known,
            ``labels``), as for ``dataset="file"``. By default the test split.
        folds: Cross-validation: the sequences not held out for testing split into this many
            folds, stratified by class and chosen with ``seed``; ``fold`` is the validation set,
            the others train. ``val_fraction`` does not apply. By default (``None``)
            ``val_fraction`` is held out.
        fold: The fold, from 0 to ``folds - 1``, that validates.

    What each argument accepts is in its type, which the command line checks where the value is given; what
    relates two of them is checked here (``_check_arguments``).
    """

    def __init__(
        self,
        dataset: Literal["synthetic", "file"] = "synthetic",
        path: str = "data/sequences.npz",
        vocab_size: PositiveInt = 16,
        seq_len: PositiveInt = 32,
        num_classes: NumClasses = 2,
        num_sequences: NonNegativeInt = 8000,
        val_fraction: Fraction = VAL_FRACTION,
        test_fraction: Fraction = 0.1,
        batch_size: BatchSize = 64,
        num_workers: Workers = 0,
        seed: Seed = 42,
        predict_path: str | None = None,
        folds: Folds | None = None,
        fold: Fold = 0,
    ) -> None:
        check_folds(folds, fold, val_fraction, VAL_FRACTION)
        _check_arguments(dataset, vocab_size, seq_len, num_classes, num_sequences, val_fraction, test_fraction)
        super().__init__(batch_size=batch_size, seed=seed, num_workers=num_workers)
        self.save_hyperparameters()
        # What the network and the Classifier take from the data (the links in cli.py).
        self.vocab_size, self.seq_len, self.num_classes = vocab_size, seq_len, num_classes
        if dataset == "synthetic":
            self.class_names = ["1 before 0", "0 before 1"]  # which marker comes first
        else:
            self.class_names = [str(label) for label in range(num_classes)]

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "predict" and hp.predict_path:
            if "predict" not in self.splits:  # your file, and nothing else
                path = Path(hp.predict_path)
                tokens, labels = read_sequences(path, hp.vocab_size, hp.num_classes, hp.seq_len, labels_required=False)
                unknown = torch.full((len(tokens),), -1)
                self.splits["predict"] = InMemoryDataset(tokens, labels if labels is not None else unknown)
                self.predict_names = [f"{path.name}[{index}]" for index in range(len(tokens))]
                self.predict_labelled = labels is not None
            return
        if "train" in self.splits:
            return
        if hp.dataset == "synthetic":
            tokens, labels = make_order_task(hp.num_sequences, hp.seq_len, hp.vocab_size, seed=self.seed)
        else:
            tokens, labels = read_sequences(Path(hp.path), hp.vocab_size, hp.num_classes, hp.seq_len)
        n = len(labels)
        sizes = _split_sizes(n, hp.val_fraction, hp.test_fraction)
        if min(sizes if hp.folds is None else [n - sizes[2], sizes[2]]) < 1:
            # Synthetic sizes are checked at construction; a file's is known only now.
            raise ConfigError(
                f"{hp.path} holds {n} sequences, too few for one training, validation and test sequence each at "
                f"--data.val_fraction {hp.val_fraction} and --data.test_fraction {hp.test_fraction} "
                f"({_enough_sequences(hp.val_fraction, hp.test_fraction)} or more do)"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        parts = order.split(sizes)
        if hp.folds is not None:  # the same test split; the folds divide the rest
            pool = order[: n - sizes[2]]
            train, val = fold_split(labels[pool].numpy(), hp.folds, hp.fold, self.seed, self.class_names)
            parts = (pool[torch.from_numpy(train)], pool[torch.from_numpy(val)], parts[2])
        self.splits.update(
            (name, InMemoryDataset(tokens[idx], labels[idx]))
            for name, idx in zip(("train", "val", "test"), parts, strict=True)
        )


def _check_arguments(
    dataset: str,
    vocab_size: int,
    seq_len: int,
    num_classes: int,
    num_sequences: int,
    val_fraction: float,
    test_fraction: float,
) -> None:
    """Refuse arguments that do not go together, naming their flags: what the synthetic task needs, and splits that
    leave none for training."""
    if val_fraction + test_fraction >= 1:
        raise ConfigError(
            "--data.val_fraction and --data.test_fraction must sum to below 1, "
            f"got {val_fraction!r} and {test_fraction!r}"
        )
    if dataset != "synthetic":
        return
    if vocab_size < 3:
        raise ConfigError(
            f"--data.vocab_size must be at least 3 for the synthetic task (two markers and a filler token), "
            f"got {vocab_size!r}"
        )
    if seq_len < 2:
        raise ConfigError(
            f"--data.seq_len must be at least 2 for the synthetic task (one position per marker), got {seq_len!r}"
        )
    if num_classes != 2:
        raise ConfigError(
            "--data.num_classes must be 2 for the synthetic task (which of two markers comes first), "
            f"got {num_classes!r}"
        )
    if not _fills_every_split(num_sequences, val_fraction, test_fraction):
        raise ConfigError(
            f"--data.num_sequences must give at least one training, validation and test sequence at "
            f"--data.val_fraction {val_fraction} and --data.test_fraction {test_fraction} "
            f"({_enough_sequences(val_fraction, test_fraction)} or more do), got {num_sequences!r}"
        )
    # The tokens (int64), the random numbers and their order drawn to place the markers, and the splits' copy.
    needed = (8 + 4 + 8 + 8) * num_sequences * seq_len
    check_memory(
        needed, "the synthetic sequences", ["--data.num_sequences", "--data.seq_len"], [num_sequences, seq_len]
    )


def _split_sizes(n: int, val_fraction: float, test_fraction: float) -> list[int]:
    """The sizes of the training, validation and test splits of ``n`` sequences."""
    n_val, n_test = round(val_fraction * n), round(test_fraction * n)
    return [n - n_val - n_test, n_val, n_test]


def _fills_every_split(n: int, val_fraction: float, test_fraction: float) -> bool:
    """Whether ``n`` sequences give a training, validation and test sequence each."""
    return min(_split_sizes(n, val_fraction, test_fraction)) > 0


def _enough_sequences(val_fraction: float, test_fraction: float) -> int:
    """A number of sequences from which on every split gets at least one (some fewer may too)."""
    # round(f * n) >= 1 once f * n > 0.5; the training split, n - round(v * n) - round(t * n),
    # is at least n * (1 - v - t) - 1, so it is positive once n * (1 - v - t) > 1.
    bounds = (0.5 / val_fraction, 0.5 / test_fraction, 1 / (1 - val_fraction - test_fraction))
    n = 1 + max(math.floor(bound) for bound in bounds)
    while not _fills_every_split(n, val_fraction, test_fraction):  # in case floating point put the bound one short
        n += 1
    return n


def make_order_task(num_sequences: int, seq_len: int, vocab_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate the synthetic order task: ``int64`` tokens ``(N, seq_len)`` and labels ``(N,)``.

    Filler tokens are drawn from ``[2, vocab_size)``; markers 0 and 1 are put at two
    distinct random positions; the label says whether marker 0 comes first.
    """
    if vocab_size < 3 or seq_len < 2:
        raise ValueError(
            f"the order task needs two markers, a filler token and two positions: vocab_size {vocab_size} "
            f"must be at least 3 and seq_len {seq_len} at least 2"
        )
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, vocab_size, (num_sequences, seq_len), generator=generator)
    positions = torch.rand(num_sequences, seq_len, generator=generator).argsort(dim=1)[:, :2]  # two distinct
    rows = torch.arange(num_sequences)
    tokens[rows, positions[:, 0]] = FIRST_MARKER
    tokens[rows, positions[:, 1]] = SECOND_MARKER
    labels = (positions[:, 0] < positions[:, 1]).long()
    return tokens, labels


def read_sequences(
    path: Path, vocab_size: int, num_classes: int, seq_len: int, labels_required: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Read and check an ``.npz`` file of ``tokens`` ``(N, T)``, ``T <= seq_len``, and ``labels`` ``(N,)``.

    Returns ``int64`` tensors; the labels are ``None`` when the file has none and they are
    not required (inputs to predict on). A file that cannot be read, or whose arrays do not
    fit the arguments, stops with one line naming the file and what is wrong.
    """
    how = "Save your data with numpy.savez(path, tokens=..., labels=...)"
    if not path.exists():
        raise DataUnavailableError(
            f"{path} does not exist. {how}, or train on offline data with --data.dataset synthetic."
        )
    try:
        # Refused unless a plain file: a FIFO or device would never finish reading, a folder is no .npz.
        with open_regular(path) as file:
            # An .npz file is a zip archive; np.load would read anything else as another format.
            if not zipfile.is_zipfile(file):
                what = "is empty" if os.fstat(file.fileno()).st_size == 0 else "is not an .npz file, or is damaged"
                raise DataUnavailableError(f"{path} {what}. {how}.")
            file.seek(0)
            with np.load(file, allow_pickle=False) as archive:  # arrays only: a pickled object is refused
                found = archive.files
                arrays = {name: archive[name] for name in ("tokens", "labels") if name in found}
    except NotAFileError as err:
        raise DataUnavailableError(f"{err}. {how}.") from err
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise DataUnavailableError(f"{path} could not be read as an .npz file ({err}). {how}.") from err
    needed = {"tokens", "labels"} if labels_required else {"tokens"}
    if not needed <= arrays.keys():
        missing = sorted(needed - arrays.keys())
        raise ConfigError(f"{path} lacks the array(s) {missing}; it has {found}. {how}.")
    tokens, labels = arrays["tokens"], arrays.get("labels")
    if tokens.ndim != 2 or tokens.shape[1] == 0 or (labels is not None and labels.shape != tokens.shape[:1]):
        raise ConfigError(
            f"{path}: tokens must be (N, T) with T >= 1 and labels (N,), "
            f"got {tuple(tokens.shape)} and {tuple(labels.shape) if labels is not None else 'no labels'}"
        )
    for name, array in (("tokens", tokens), ("labels", labels)):
        if array is not None and not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
            raise ConfigError(f"{path}: {name} must be integers, got {array.dtype}")
    if len(tokens) == 0:
        raise ConfigError(f"{path} holds no sequences. {how}.")
    if tokens.shape[1] > seq_len:
        raise ConfigError(
            f"{path} holds sequences of {tokens.shape[1]} tokens, longer than --data.seq_len {seq_len}: "
            f"set --data.seq_len to at least {tokens.shape[1]}"
        )
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ConfigError(
            f"{path}: token ids must lie in [0, {vocab_size}) of --data.vocab_size {vocab_size}, "
            f"found [{tokens.min()}, {tokens.max()}]"
        )
    if labels is not None and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"{path}: labels must lie in [0, {num_classes}) of --data.num_classes {num_classes}, "
            f"found [{labels.min()}, {labels.max()}]"
        )
    tokens = torch.from_numpy(tokens.astype(np.int64))
    return tokens, torch.from_numpy(labels.astype(np.int64)) if labels is not None else None
