"""Image data: CIFAR-10 or an offline synthetic stand-in, held in memory as uint8."""

from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeInt
from lightning_kit.arguments import BatchSize, Fold, Folds, Fraction, Seed, Workers, check_memory
from lightning_kit.data import InMemoryDataset
from lightning_kit.data.folds import check_folds, fold_split
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


def _rarest(size: int, seed: int) -> tuple[str, int]:
    """The synthetic class with the fewest of ``size`` training images at ``seed``, and their number."""
    counts = torch.bincount(synthetic_labels(size, seed), minlength=NUM_CLASSES)
    return f"pattern {int(counts.argmin())}", int(counts.min())


# The validation share held out unless folds say which images validate.
VAL_FRACTION = 0.1


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

    What each argument accepts is in its type, which the command line checks where the value is given; what
    relates two of them is checked here.
    """

    def __init__(
        self,
        dataset: Literal["cifar10", "synthetic"] = "cifar10",
        data_dir: str = "data",
        batch_size: BatchSize = 64,
        val_fraction: Fraction = VAL_FRACTION,
        synthetic_size: NonNegativeInt = 6000,
        augment: bool = True,
        num_workers: Workers = 0,
        seed: Seed = 42,
        predict_path: str | None = None,
        folds: Folds | None = None,
        fold: Fold = 0,
    ) -> None:
        check_folds(folds, fold, val_fraction, VAL_FRACTION)
        if dataset == "synthetic":
            _check_synthetic(synthetic_size, val_fraction, seed, folds)
        super().__init__(
            batch_size=batch_size, seed=seed, num_workers=num_workers, augment=augment, predict_path=predict_path
        )
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
            train = make_synthetic_images(size, seed=self.seed)
            test = make_synthetic_images(size // 5, seed=self.seed + 1)
        images, labels = train
        hp = self.hparams
        if hp.folds is None:
            train_idx, val_idx = self._val_split(len(labels))
        else:
            split = fold_split(labels.numpy(), hp.folds, hp.fold, self.seed, self.class_names)
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
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed))
        return order[val_size:], order[:val_size]


def _check_synthetic(size: int, val_fraction: float, seed: int, folds: int | None) -> None:
    """Refuse a synthetic data set that leaves a split empty, does not fit in memory, or has a class with fewer
    training images than there are folds: each known before the images are made (CIFAR-10's once read)."""
    if not fills_every_split(size, val_fraction):
        raise ConfigError(
            f"--data.synthetic_size must be an integer of at least {smallest_synthetic_size(val_fraction)} at "
            f"--data.val_fraction {val_fraction}, for a training, validation and test image each, got {size!r}"
        )
    # While generated: the uint8 images, float32 noise and two float32 intermediates (the test split's fifth comes
    # after those are freed), and the splits' copy.
    needed = (1 + 3 * 4 + 1) * 3 * 32 * 32 * size
    check_memory(needed, "the synthetic images", ["--data.synthetic_size"], [size])
    if folds is not None and (rarest := _rarest(size, seed))[1] < folds:
        raise ConfigError(
            f"--data.folds must be at most {rarest[1]}, the training images of synthetic class {rarest[0]!r} at "
            f"--data.synthetic_size and --data.seed, for one of each class per fold, got {folds!r} and {size!r} "
            f"and {seed!r}"
        )
