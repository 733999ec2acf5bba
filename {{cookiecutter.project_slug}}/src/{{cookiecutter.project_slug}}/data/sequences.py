"""Sequence data: a synthetic task in which order matters, or token sequences from a file."""

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from . import DataUnavailableError, InMemoryDataModule, InMemoryDataset

# Token ids of the two markers in the synthetic task; every other id is filler.
FIRST_MARKER, SECOND_MARKER = 0, 1


class SequenceDataModule(InMemoryDataModule):
    """Fixed-length token sequences with one class label each.

    ``dataset="synthetic"`` generates sequences in which two marker tokens appear
    once each, labelled 1 when marker 0 comes before marker 1 and 0 otherwise: the
    same tokens in another order change the label, so a model must use positions.

    ``dataset="file"`` reads ``path``, an ``.npz`` file (``numpy.savez``) with
    ``tokens``, integer ids of shape ``(N, seq_len)`` in ``[0, vocab_size)``, and
    ``labels``, integers of shape ``(N,)`` in ``[0, num_classes)``.

    Args:
        dataset: ``"synthetic"`` or ``"file"``.
        path: The ``.npz`` file read when ``dataset="file"``.
        vocab_size: Number of distinct token ids (must match the network's).
        seq_len: Tokens per sequence (at most the network's ``max_len``).
        num_classes: Number of labels (must match the network's).
        num_sequences: Sequences generated when ``dataset="synthetic"``.
        val_fraction: Share of the sequences held out for validation.
        test_fraction: Share of the sequences held out for testing.
        batch_size: Sequences per batch, per device.
        num_workers: Loader processes; slicing in-memory tensors needs none.
        seed: Seed of the split and of the synthetic sequences.
    """

    def __init__(
        self,
        dataset: Literal["synthetic", "file"] = "synthetic",
        path: str = "data/sequences.npz",
        vocab_size: int = 16,
        seq_len: int = 32,
        num_classes: int = 2,
        num_sequences: int = 8000,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 42,
    ) -> None:
        super().__init__()
        if not (val_fraction > 0 and test_fraction > 0 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} must be positive and sum to below 1"
            )
        self.save_hyperparameters()
        self.num_classes = num_classes

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        hp = self.hparams
        if hp.dataset == "synthetic":
            tokens, labels = make_order_task(hp.num_sequences, hp.seq_len, hp.vocab_size, seed=hp.seed)
        else:
            tokens, labels = read_sequences(Path(hp.path), hp.vocab_size, hp.num_classes)
        n = len(labels)
        n_val, n_test = round(hp.val_fraction * n), round(hp.test_fraction * n)
        if min(n_val, n_test, n - n_val - n_test) < 1:
            raise ValueError(f"{n} sequences are too few to split into train, validation and test")
        order = torch.randperm(n, generator=torch.Generator().manual_seed(hp.seed))
        parts = order.split([n - n_val - n_test, n_val, n_test])
        self.splits = {
            name: InMemoryDataset(tokens[idx], labels[idx])
            for name, idx in zip(("train", "val", "test"), parts, strict=True)
        }


def make_order_task(num_sequences: int, seq_len: int, vocab_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate the synthetic order task: ``int64`` tokens ``(N, seq_len)`` and labels ``(N,)``.

    Filler tokens are drawn from ``[2, vocab_size)``; markers 0 and 1 are put at two
    distinct random positions; the label says whether marker 0 comes first.
    """
    assert vocab_size > 2 and seq_len >= 2, "the order task needs two markers, one filler token and two positions"
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, vocab_size, (num_sequences, seq_len), generator=generator)
    positions = torch.rand(num_sequences, seq_len, generator=generator).argsort(dim=1)[:, :2]  # two distinct
    rows = torch.arange(num_sequences)
    tokens[rows, positions[:, 0]] = FIRST_MARKER
    tokens[rows, positions[:, 1]] = SECOND_MARKER
    labels = (positions[:, 0] < positions[:, 1]).long()
    return tokens, labels


def read_sequences(path: Path, vocab_size: int, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read and check an ``.npz`` file of ``tokens`` ``(N, T)`` and ``labels`` ``(N,)``."""
    if not path.is_file():
        raise DataUnavailableError(
            f"{path} does not exist. Save your data with numpy.savez(path, tokens=..., labels=...), "
            "or train on offline data with --data.dataset synthetic."
        )
    with np.load(path, allow_pickle=False) as archive:
        missing = {"tokens", "labels"} - set(archive.files)
        if missing:
            raise ValueError(f"{path} lacks the array(s) {sorted(missing)}; it has {archive.files}")
        tokens, labels = torch.from_numpy(archive["tokens"]), torch.from_numpy(archive["labels"])
    if tokens.ndim != 2 or labels.shape != tokens.shape[:1]:
        raise ValueError(
            f"{path}: tokens must be (N, T) and labels (N,), got {tuple(tokens.shape)} and {tuple(labels.shape)}"
        )
    if tokens.is_floating_point() or labels.is_floating_point():
        raise ValueError(f"{path}: tokens and labels must be integers")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"{path}: token ids must lie in [0, {vocab_size}), found [{tokens.min()}, {tokens.max()}]")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"{path}: labels must lie in [0, {num_classes}), found [{labels.min()}, {labels.max()}]")
    return tokens.long(), labels.long()
