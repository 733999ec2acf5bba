"""Image folders of your own: one folder per class, decoded once into memory as uint8 and cached."""

import functools
from pathlib import Path

import torch

from ..arguments import BatchSize, Fold, Folds, Fraction, ImageSize, Seed, Workers
from ..errors import ConfigError, DataUnavailableError
from .folds import check_folds, fold_split
from .image_decoding import channel_stats
from .image_files import ImageFiles, find_classes, list_labelled_images
from .image_splits import ImageSplits, check_decoded_size
from .memory import InMemoryDataset

SPLIT_FOLDERS = ("train", "val", "test")
# The validation share held out when nothing else says which images validate.
VAL_FRACTION = 0.1


class ImageFolderDataModule(ImageSplits):
    """Your own images: one folder per class of image files (torchvision's ``ImageFolder`` layout).

    ``root`` is either ``root/<class>/*.jpg`` (``val_fraction`` of it validates; no test split), or
    ``root/train/<class>/...`` with optional ``val/`` and ``test/`` beside it. Images are decoded once, resized whole
    to ``image_size`` squared and cached in ``cache_dir``; the training split's per-channel mean and standard
    deviation become the network's normalisation. The arguments shared with ``ImageSplits`` and
    ``InMemoryDataModule`` are described there.

    Args:
        root: The image folder (see above).
        image_size: Height and width the images are resized to; the network takes it from here.
        val_fraction: Share of the training images held out for validation when there is no ``val/`` folder.
        cache_dir: Folder for the decoded images; ``null`` decodes on every run.
        seed: Seed of the train/validation split.
        folds: Cross-validation: the training images (with ``val/``'s) split into this many folds, stratified by
            class and chosen with ``seed``; fold ``fold`` validates. By default (``None``) the ``val/`` folder, or
            ``val_fraction`` of the training images, validates.
        fold: The fold, from 0 to ``folds - 1``, that validates.
    """

    def __init__(
        self,
        root: str,
        image_size: ImageSize = 32,
        val_fraction: Fraction = VAL_FRACTION,
        batch_size: BatchSize = 64,
        augment: bool = True,
        skip_unreadable: bool = False,
        cache_dir: str | None = "data/cache",
        predict_path: str | None = None,
        num_workers: Workers = 0,
        seed: Seed = 42,
        folds: Folds | None = None,
        fold: Fold = 0,
    ) -> None:
        check_folds(folds, fold, val_fraction, VAL_FRACTION)
        check_decoded_size(1, image_size)  # a size no image of the folder could be decoded at
        super().__init__(
            batch_size=batch_size,
            seed=seed,
            num_workers=num_workers,
            augment=augment,
            predict_path=predict_path,
            skip_unreadable=skip_unreadable,
        )
        self.save_hyperparameters()
        self.folders = split_folders(Path(root))
        self.class_names = list(find_classes(self.folders["train"]))
        if len(self.class_names) < 2:
            raise ConfigError(
                f"{self.folders['train']} holds {len(self.class_names)} class folder(s) "
                f"({', '.join(self.class_names) or 'none'}): a classifier needs at least 2"
            )
        self.num_classes = len(self.class_names)
        self.image_size = image_size
        # Per-channel (mean, std) of the training images, in [0, 1] units, once read.
        self.normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def has_data_for(self, stage: str) -> bool:
        """Whether ``stage`` has images here (``test`` needs a ``test/`` folder): the device audit skips it if not."""
        if stage == "predict" and self.predict_path:
            return True
        return "test" not in _SPLITS_OF[stage] or self.folders["test"] is not None

    def prepare_data(self) -> None:
        # Decoded once per machine, by one process; the others read the cache in setup.
        if self.hparams.cache_dir is not None and not self.predicting_files():
            needed = _SPLITS_OF[self.trainer.state.fn.value if self.trainer is not None else "fit"]
            found = [self._files(split) for split in needed]  # the layout is checked before the slow part
            for files in dict.fromkeys(found):  # with folds, train and val are one set of files
                if files is not None:
                    self.decode_files(files, self.hparams.cache_dir)

    def setup(self, stage: str) -> None:
        if self.setup_predict(stage):
            return
        for split in _SPLITS_OF[stage]:
            if split in self.splits:
                continue
            files = self._files(split)
            if files is None:
                raise ConfigError(
                    f"{self.hparams.root} has no {split} split: put its images in {self.hparams.root}/{split}/<class>/ "
                    "(beside train/)" + (", or give --data.predict_path for predict" if stage == "predict" else "")
                )
            images, labels, _ = self.decode_files(files, self.hparams.cache_dir)
            folded = self.hparams.folds is not None and split != "test"
            if folded:  # train: every fold but --data.fold, which validates
                hp = self.hparams
                parts = fold_split(labels.numpy(), hp.folds, hp.fold, self.seed, self.class_names)
                for name, index in zip(("train", "val"), map(torch.from_numpy, parts), strict=True):
                    self.splits[name] = InMemoryDataset(images[index], labels[index])
            else:
                self.splits[split] = InMemoryDataset(images, labels)
            if split == "train" or folded:
                self.normalization = channel_stats(self.splits["train"].tensors[0])

    @functools.cached_property
    def _training_folder(self) -> ImageFiles:
        """Every file of the training folder, listed once for the splits that draw from it."""
        return list_labelled_images(self.folders["train"])

    def _files(self, split: str) -> ImageFiles | None:
        """The files of ``split`` with their labels; ``None`` for a test split the folder does not have. With folds,
        train and val are the same files (the training folder's and val/'s), which setup divides."""
        folder = self.folders[split]
        if self.hparams.folds is not None and split != "test":
            found = self._training_folder
            if self.folders["val"] is None:
                return found
            val = list_labelled_images(self.folders["val"], self.class_names)
            return ImageFiles(found.files + val.files, found.labels + val.labels, found.class_names)
        if split == "train" and self.folders["val"] is not None:
            return self._training_folder
        if split != "train" and folder is not None:  # a val/ or test/ folder
            return list_labelled_images(folder, self.class_names)
        if split == "test":
            return None
        # No val/ folder: a seeded share of the training files, the same on every run and process.
        found = self._training_folder
        count = len(found.files)
        val_size = round(self.hparams.val_fraction * count)
        if not 0 < val_size < count:
            raise ConfigError(
                f"--data.val_fraction {self.hparams.val_fraction} of the {count} images in {self.folders['train']} "
                "leaves no training or no validation image: add images, or a val/ folder"
            )
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed)).tolist()
        chosen = sorted(order[:val_size] if split == "val" else order[val_size:])
        return ImageFiles(
            files=tuple(found.files[i] for i in chosen),
            labels=tuple(found.labels[i] for i in chosen),
            class_names=found.class_names,
        )


# The splits each stage reads (predict: unless given --data.predict_path).
_SPLITS_OF = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}


def split_folders(root: Path) -> dict[str, Path | None]:
    """Where ``root``'s splits are: in ``train``, ``val`` and ``test`` folders when it has ``train`` and no other
    folders, else ``root`` itself trains; a split's folder among others is refused (it would train as a class)."""
    if not root.is_dir():
        raise DataUnavailableError(
            f"--data.root {root} is not a folder: give a folder holding one folder of images per class"
        )
    names = {path.name for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")}
    if "train" in names and names <= set(SPLIT_FOLDERS):
        return {split: root / split if split in names else None for split in SPLIT_FOLDERS}
    if names & {*SPLIT_FOLDERS, *_OTHER_SPLIT_NAMES}:  # a split among other folders would train as a class
        renames = [f"{name}/ to {_OTHER_SPLIT_NAMES[name]}/" for name in sorted(names & {*_OTHER_SPLIT_NAMES})]
        raise DataUnavailableError(
            f"--data.root {root} holds {', '.join(f'{name}/' for name in sorted(names))}: give it train/ and, if "
            "you have them, val/ and test/ alone, each with one folder per class"
            + (f" (rename {', '.join(renames)})" if renames else "")
            + ", or one folder per class alone"
        )
    return {"train": root, "val": None, "test": None}


# Names of splits in data sets as published (Kaggle, Roboflow, ...), which the splits here are named otherwise.
_OTHER_SPLIT_NAMES = {"valid": "val", "validation": "val", "training": "train", "testing": "test"}
