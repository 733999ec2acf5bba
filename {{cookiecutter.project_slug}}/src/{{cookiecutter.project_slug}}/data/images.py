"""Image data: CIFAR-10 or an offline synthetic stand-in, held in memory as uint8."""

from pathlib import Path
from typing import Literal

import torch
from lightning_kit.arguments import (
    BATCH_SIZE,
    BOOLEAN,
    FRACTION,
    SEED,
    WORKERS,
    Arguments,
    FitsInMemory,
    Together,
    integer,
    one_of,
)
from lightning_kit.data import InMemoryDataset
from lightning_kit.data.folds import FOLD_ARGUMENTS, fold_rules, fold_split
from lightning_kit.data.image_splits import ImageSplits
from lightning_kit.errors import ConfigError

from .cifar10 import (
    CIFAR10_CLASSES,
    CIFAR10_FOLDER,
    CIFAR10_TEST_BATCH,
    CIFAR10_TRAIN_BATCHES,
    ensure_cifar10,
    read_cifar10_batches,
)
from .synthetic import (
    NUM_CLASSES,
    fills_every_split,
    make_synthetic_images,
    smallest_synthetic_size,
    synthetic_labels,
)

DATASETS = ("cifar10", "synthetic")


def _rarest(size: int, seed: int) -> tuple[str, int]:
    """The synthetic class with the fewest of ``size`` training images at ``seed``, and their number."""
    counts = torch.bincount(synthetic_labels(size, seed), minlength=NUM_CLASSES)
    return f"pattern {int(counts.argmin())}", int(counts.min())


IMAGE_DATA_ARGUMENTS = Arguments(
    "--data.",
    {
        "dataset": one_of(*DATASETS),
        "batch_size": BATCH_SIZE,
        "val_fraction": FRACTION,
        "synthetic_size": integer(0),
        "augment": BOOLEAN,
        "num_workers": WORKERS,
        "seed": SEED,
        **FOLD_ARGUMENTS,
    },
    rules=[
        *fold_rules(val_fraction=0.1),
        Together(
            ("synthetic_size", "val_fraction", "dataset"),
            lambda size, val_fraction, dataset: dataset != "synthetic" or fills_every_split(size, val_fraction),
            lambda size, val_fraction, dataset: (
                f"<synthetic_size> must be an integer of at least {smallest_synthetic_size(val_fraction)} at "
                f"<val_fraction> {val_fraction}, for a training, validation and test image each"
            ),
            shown=("synthetic_size",),
        ),
        # While generated: the uint8 images, float32 noise and two float32 intermediates (the test split's
        # fifth comes after those are freed), and the splits' copy.
        FitsInMemory(
            ("synthetic_size", "dataset"),
            lambda size, dataset: (1 + 3 * 4 + 1) * 3 * 32 * 32 * size if dataset == "synthetic" else 0,
            "the synthetic images",
            shown=("synthetic_size",),
        ),
        # Known before the images are made (CIFAR-10's classes are checked once read).
        Together(
            ("folds", "synthetic_size", "seed", "dataset"),
            lambda folds, size, seed, dataset: (
                folds is None or dataset != "synthetic" or _rarest(size, seed)[1] >= folds
            ),
            lambda folds, size, seed, dataset: (
                "<folds> must be at most {1}, the training images of synthetic class {0!r} at <synthetic_size> and "
                "<seed>, for one of each class per fold".format(*_rarest(size, seed))
            ),
            shown=("folds", "synthetic_size", "seed"),
        ),
    ],
)


class ImageDataModule(ImageSplits):
    """CIFAR-10 (``dataset="cifar10"``) or synthetic images (``dataset="synthetic"``).

    Each split is one ``uint8`` tensor of shape ``(N, 3, 32, 32)``: the loaders only
    slice batches, which Lightning moves to the accelerator, where random crops and
    flips are applied to whole training batches at once.

    Args:
        dataset: ``"cifar10"`` (downloaded into ``data_dir`` when missing) or
            ``"synthetic"`` (generated from ``seed``, nothing read or downloaded).
        data_dir: Folder holding ``cifar-10-python.tar.gz`` or its extracted folder.
        batch_size: Images per batch, per device.
        val_fraction: Share of the training images held out for validation, chosen with ``seed``; in (0, 1).
        synthetic_size: Images in the synthetic training split (the test split has a fifth of that);
            enough for at least one training, validation and test image.
        augment: Random crop (4 pixels of padding) and horizontal flip on training batches.
        num_workers: Loader processes; slicing in-memory tensors needs none.
        seed: Seed of the train/validation split and of the synthetic images.
        predict_path: What ``predict`` runs on: an image file, a folder of them (labelled when
            its subfolders are class names), or a ``.txt`` list of image paths; resized to 32x32.
            By default the test split.
        folds: Cross-validation: the training images split into this many folds, stratified by
            class and chosen with ``seed``; ``fold`` is the validation set, the others train.
            ``val_fraction`` does not apply. By default (``None``) ``val_fraction`` is held out.
        fold: The fold, from 0 to ``folds - 1``, that validates.

    What each argument accepts is in ``IMAGE_DATA_ARGUMENTS``.
    """

    def __init__(
        self,
        dataset: Literal["cifar10", "synthetic"] = "cifar10",
        data_dir: str = "data",
        batch_size: int = 64,
        val_fraction: float = 0.1,
        synthetic_size: int = 6000,
        augment: bool = True,
        num_workers: int = 0,
        seed: int = 42,
        predict_path: str | None = None,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        IMAGE_DATA_ARGUMENTS.check(locals())
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = NUM_CLASSES
        self.image_size = 32
        self.class_names = (
            list(CIFAR10_CLASSES) if dataset == "cifar10" else [f"pattern {k}" for k in range(NUM_CLASSES)]
        )

    def prepare_data(self) -> None:
        if self.hparams.dataset == "cifar10" and not self.predicting_files():
            ensure_cifar10(Path(self.hparams.data_dir))

    def setup(self, stage: str) -> None:
        if self.setup_predict(stage) or "train" in self.splits:
            return
        if self.hparams.dataset == "cifar10":
            folder = Path(self.hparams.data_dir) / CIFAR10_FOLDER
            train = read_cifar10_batches(folder, CIFAR10_TRAIN_BATCHES)
            test = read_cifar10_batches(folder, (CIFAR10_TEST_BATCH,))
        else:
            size = self.hparams.synthetic_size
            train = make_synthetic_images(size, seed=self.hparams.seed)
            test = make_synthetic_images(size // 5, seed=self.hparams.seed + 1)
        images, labels = train
        hp = self.hparams
        if hp.folds is None:
            train_idx, val_idx = self._val_split(len(labels))
        else:
            split = fold_split(labels.numpy(), hp.folds, hp.fold, hp.seed, self.class_names)
            train_idx, val_idx = map(torch.from_numpy, split)
        self.splits.update(
            train=InMemoryDataset(images[train_idx], labels[train_idx]),
            val=InMemoryDataset(images[val_idx], labels[val_idx]),
            test=InMemoryDataset(*test),
        )

    def _val_split(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training and validation indices of ``count`` images: ``val_fraction`` of them, chosen with the seed."""
        val_size = round(self.hparams.val_fraction * count)
        if not 0 < val_size < count:
            # Synthetic sizes are checked at construction; CIFAR-10's size is known only now.
            raise ConfigError(
                f"--data.val_fraction must leave at least one training and one validation image of the "
                f"{count} training images, got {self.hparams.val_fraction}"
            )
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.hparams.seed))
        return order[val_size:], order[:val_size]
