"""The in-memory base of every data module: tensors split once, sliced into batches, resumable mid-epoch."""

from abc import ABC, abstractmethod
from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from ..arguments import BatchSize, Seed, Workers
from ..errors import DataUnavailableError


class InMemoryDataset(TensorDataset):
    """Tensors indexed along their first dimension, a whole batch per call: ``DataLoader`` hands ``__getitems__`` the
    batch's indices at once, so a batch is one slice of each tensor instead of one call and one stack per item."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)


class EpochShuffle(RandomSampler):
    """A shuffled order that depends only on ``seed`` and the epoch (Lightning calls ``set_epoch``), so a resumed run
    sees the same order as one that never stopped. Under DDP, Lightning replaces it with a ``DistributedSampler``,
    which shuffles the same way: it is a ``RandomSampler`` so that Lightning knows it shuffles."""

    def __init__(self, data_source: TensorDataset, seed: int) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


class InMemoryDataModule(L.LightningDataModule, ABC):
    """Serves the ``train``, ``val`` and ``test`` splits that a subclass's ``setup`` puts in ``self.splits``, each an
    ``InMemoryDataset`` of (inputs, labels); training batches are shuffled per epoch.

    Subclasses take ``batch_size``, ``seed`` and ``num_workers`` in their own signature (where the command line
    reads them) and pass them on; their ``__init__`` sets ``num_classes`` and ``class_names``. ``predict`` runs on a
    ``predict`` split when ``setup`` made one, else on the test split; ``predict_names`` names each input for the
    predictions CSV (``None``: its index) and ``predict_labelled`` says whether its labels are true ones.

    Args:
        batch_size: Samples per batch, per device.
        seed: Seed of the training order (with the epoch), and of what a subclass draws.
        num_workers: Loader processes; slicing in-memory tensors needs none.
    """

    def __init__(self, batch_size: BatchSize = 64, seed: Seed = 42, num_workers: Workers = 0) -> None:
        super().__init__()
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.splits: dict[str, InMemoryDataset] = {}
        self.num_classes: int | None = None
        self.class_names: list[str] | None = None
        self.predict_names: list[str] | None = None
        self.predict_labelled = True

    @abstractmethod
    def setup(self, stage: str) -> None:
        """Put the splits that ``stage`` needs in ``self.splits`` (``fit``: train and val)."""

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict" if "predict" in self.splits else "test", shuffle=False)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = self.splits[split]
        if split != "predict" or self.predict_labelled:
            self._check_labels(split, dataset.tensors[-1])
        return ResumableLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffle(dataset, self.seed) if shuffle else None,
            collate_fn=_already_batched,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Its own generator: making an iterator must not draw from the global one,
            # or a resumed run's random numbers (dropout, ...) would drift from an uninterrupted run's.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _check_labels(self, split: str, labels: torch.Tensor) -> None:
        """A class label (one per example) outside 0 to ``num_classes - 1`` stops the loss, on a GPU as a device-side
        assert: named here. -100 is cross_entropy's ``ignore_index``."""
        if self.num_classes is None or labels.dim() != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
            return
        wrong = labels[((labels < 0) & (labels != -100)) | (labels >= self.num_classes)].unique()
        if wrong.numel():
            raise DataUnavailableError(
                f"{type(self).__name__}'s {split} split has labels {', '.join(map(str, wrong[:5].tolist()))}: class "
                f"labels must be 0 to {self.num_classes - 1}, one for each of its {self.num_classes} classes "
                "(num_classes, class_names)"
            )


class ResumableLoader(DataLoader):
    """A DataLoader that resumes mid-epoch: Lightning saves its ``state_dict`` in each checkpoint, and a run resumed
    from one goes on with the batches the interrupted run had not yet seen, instead of starting the epoch over."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._taken = 0  # batches taken from the current pass over the data
        self._resume_at = 0

    def __iter__(self) -> Iterator:
        skip, self._resume_at = self._resume_at, 0
        self._taken = 0
        for batch in super().__iter__():
            self._taken += 1
            if self._taken > skip:
                yield batch

    def state_dict(self) -> dict[str, int]:
        return {"taken": self._taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["taken"]


def _already_batched(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return batch
