"""LightningDataModules: where data comes from, how it is split and batched."""

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


class DataUnavailableError(RuntimeError):
    """The configured data set is not on disk and could not be fetched."""


class InMemoryDataset(TensorDataset):
    """Tensors indexed along their first dimension, a whole batch per call.

    ``DataLoader`` hands ``__getitems__`` the batch's indices at once, so a batch is
    one slice of each tensor instead of one Python call and one stack per item.
    """

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)


class EpochShuffle(RandomSampler):
    """A shuffled order that depends only on ``seed`` and the epoch.

    Lightning calls ``set_epoch`` at the start of every epoch, so a run resumed from
    a checkpoint sees the same order as one that never stopped. Under DDP, Lightning
    replaces it with a ``DistributedSampler``, which shuffles the same way.
    """

    def __init__(self, data_source: TensorDataset, seed: int) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


def batch_loader(
    dataset: InMemoryDataset, batch_size: int, shuffle: bool, seed: int, num_workers: int = 0
) -> DataLoader:
    """A DataLoader of ``(inputs, labels)`` batches sliced from ``dataset``, shuffled per epoch if asked."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EpochShuffle(dataset, seed) if shuffle else None,
        collate_fn=_already_batched,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


def _already_batched(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return batch
