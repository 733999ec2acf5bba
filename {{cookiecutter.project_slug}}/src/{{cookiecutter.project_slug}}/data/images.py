"""Image data: CIFAR-10, an offline synthetic stand-in, or folders of your own images, held in memory as uint8."""

import hashlib
import math
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import zlib
from pathlib import Path, PurePosixPath
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from ..arguments import (
    BATCH_SIZE,
    BOOLEAN,
    FRACTION,
    SEED,
    WORKERS,
    Arguments,
    FitsInMemory,
    Together,
    check_memory,
    integer,
    is_integer,
    one_of,
)
from ..errors import ConfigError
from ..files import NotAFileError, kind_of, open_regular
from . import DataUnavailableError, InMemoryDataModule, InMemoryDataset
from .folders import ImageFiles, channel_stats, find_classes, list_images, list_labelled_images, load_images

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_BATCHES = (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH)
DATASETS = ("cifar10", "synthetic")
NUM_CLASSES = 10
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLIT_FOLDERS = ("train", "val", "test")
# The synthetic classes' patterns are the same for every split and every seed.
SYNTHETIC_PATTERN_SEED = 1234


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
    },
    rules=[
        Together(
            ("synthetic_size", "val_fraction", "dataset"),
            lambda size, val_fraction, dataset: dataset != "synthetic" or _fills_every_split(size, val_fraction),
            lambda size, val_fraction, dataset: (
                f"<synthetic_size> must be an integer of at least {_smallest_synthetic_size(val_fraction)} at "
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
    ],
)
IMAGE_FOLDER_ARGUMENTS = Arguments(
    "--data.",
    {
        "image_size": integer(8),
        "val_fraction": FRACTION,
        "batch_size": BATCH_SIZE,
        "augment": BOOLEAN,
        "skip_unreadable": BOOLEAN,
        "num_workers": WORKERS,
        "seed": SEED,
    },
    # One image: a size no image of the folder could be decoded at.
    rules=[FitsInMemory(("image_size",), lambda size: decoded_bytes(1, size), "one decoded image")],
)


class ImageSplits(InMemoryDataModule):
    """What the image data modules share: square RGB ``uint8`` images, augmented on the accelerator,
    and predictions on image files (``predict_path``).

    Subclasses set ``image_size`` and call ``self.setup_predict(stage)`` from their ``setup``.
    """

    def setup_predict(self, stage: str) -> bool:
        """Read ``predict_path``'s images for ``predict``; whether it did (then no other split is needed)."""
        path = self.hparams.get("predict_path")
        if stage != "predict" or not path:
            return False
        if "predict" not in self.splits:
            found = list_images(Path(path), self.class_names)
            _check_decoded_size(len(found.files), self.image_size)
            images, kept = load_images(
                found.files, self.image_size, skip_unreadable=self.hparams.get("skip_unreadable", False)
            )
            labels = torch.tensor([found.labels[i] for i in kept] if found.labels else [-1] * len(kept))
            self.splits["predict"] = InMemoryDataset(images, labels)
            self.predict_names = [str(found.files[i]) for i in kept]
            self.predict_labelled = found.labels is not None
        return True

    def predicting_files(self) -> bool:
        """Whether this run is ``predict`` on ``predict_path``'s files, which needs no other data."""
        trainer = self.trainer
        return bool(self.hparams.get("predict_path")) and trainer is not None and trainer.state.fn == "predict"

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # Runs on the accelerator, after Lightning has moved the batch there.
        trainer = self.trainer
        if self.hparams.augment and trainer is not None and trainer.training:
            return self.augment(batch, step=trainer.global_step, rank=trainer.global_rank)
        return batch

    def augment(self, batch: tuple[torch.Tensor, torch.Tensor], step: int, rank: int = 0):
        """Random crops (padding of an eighth of the size: 4 pixels at 32) and flips of a training batch, where it is.

        The random numbers are drawn from the seed, the process and the step, so a
        resumed run augments exactly as one that never stopped.
        """
        images, labels = batch
        generator = torch.Generator(device=images.device)
        generator.manual_seed(hash((self.hparams.seed, rank, step)) % 2**63)
        padding = max(1, images.shape[-1] // 8)
        return random_crop_flip(images, padding=padding, generator=generator), labels


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
        val_size = round(self.hparams.val_fraction * len(labels))
        if not 0 < val_size < len(labels):
            # Synthetic sizes are checked at construction; CIFAR-10's size is known only now.
            raise ConfigError(
                f"--data.val_fraction must leave at least one training and one validation image of the "
                f"{len(labels)} training images, got {self.hparams.val_fraction}"
            )
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.seed))
        val_idx, train_idx = order[:val_size], order[val_size:]
        self.splits.update(
            train=InMemoryDataset(images[train_idx], labels[train_idx]),
            val=InMemoryDataset(images[val_idx], labels[val_idx]),
            test=InMemoryDataset(*test),
        )


class ImageFolderDataModule(ImageSplits):
    """Your own images: one folder per class of image files (torchvision's ``ImageFolder`` layout).

    ``root`` is either ``root/<class>/*.jpg`` (validation images drawn from it with
    ``val_fraction``; no test split), or ``root/train/<class>/...`` with optional
    ``root/val/<class>/...`` and ``root/test/<class>/...``. Class names are the training
    folder's subfolder names, sorted; label ``k`` is the ``k``-th. Files are taken by
    extension (PNG, JPEG, BMP, GIF, WebP, TIFF); hidden files are skipped.

    Images are decoded once, in parallel, converted to RGB and resized to ``image_size``
    squared (the whole image, not a crop), then cached in ``cache_dir`` as the ``uint8``
    tensors the loaders slice: the next run with the same files starts in seconds. The
    per-channel mean and standard deviation of the training split become the network's
    normalisation, saved in its checkpoints.

    A file that cannot be decoded stops the run with a message naming it, unless
    ``skip_unreadable`` is set: then each one skipped is reported by name.

    Args:
        root: The image folder (see above).
        image_size: Height and width the images are resized to; the network takes it from here.
        val_fraction: Share of the training images held out for validation when there is no ``val/`` folder.
        batch_size: Images per batch, per device.
        augment: Random crop (an eighth of the size as padding) and horizontal flip on training batches.
        skip_unreadable: Skip files that cannot be decoded (each reported) instead of stopping.
        cache_dir: Folder for the decoded images; ``null`` decodes on every run.
        predict_path: What ``predict`` runs on: an image file, a folder of them (labelled when its
            subfolders are class names), or a ``.txt`` list of image paths. By default the test split.
        num_workers: Loader processes; slicing in-memory tensors needs none.
        seed: Seed of the train/validation split.

    What each argument accepts is in ``IMAGE_FOLDER_ARGUMENTS``.
    """

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        val_fraction: float = 0.1,
        batch_size: int = 64,
        augment: bool = True,
        skip_unreadable: bool = False,
        cache_dir: str | None = "data/cache",
        predict_path: str | None = None,
        num_workers: int = 0,
        seed: int = 42,
    ) -> None:
        IMAGE_FOLDER_ARGUMENTS.check(locals())
        super().__init__()
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
        self._listed: ImageFiles | None = None

    def has_data_for(self, stage: str) -> bool:
        """Whether ``stage`` has images here: ``test`` (and ``predict`` without ``predict_path``) needs a ``test/``
        folder. The device audit skips a stage that has none."""
        if stage == "predict" and self.hparams.predict_path:
            return True
        return "test" not in _SPLITS_OF[stage] or self.folders["test"] is not None

    def prepare_data(self) -> None:
        # Decoded once per machine, by one process; the others read the cache in setup.
        if self.hparams.cache_dir is not None and not self.predicting_files():
            needed = _SPLITS_OF[self.trainer.state.fn.value if self.trainer is not None else "fit"]
            found = [self._files(split) for split in needed]  # the layout is checked before the slow part
            for files in found:
                if files is not None:
                    self._decode(files)

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
            images, labels = self._decode(files)
            self.splits[split] = InMemoryDataset(images, labels)
            if split == "train":
                self.normalization = channel_stats(images)

    def _training_folder(self) -> ImageFiles:
        """Every file of the training folder, listed once: the train and val splits both draw from it."""
        if self._listed is None:
            self._listed = list_labelled_images(self.folders["train"])
        return self._listed

    def _files(self, split: str) -> ImageFiles | None:
        """The files of ``split`` with their labels; ``None`` for a test split the folder does not have."""
        folder = self.folders[split]
        if split == "train" and self.folders["val"] is not None:
            return self._training_folder()
        if split != "train" and folder is not None:  # a val/ or test/ folder
            return list_labelled_images(folder, self.class_names)
        if split == "test":
            return None
        # No val/ folder: a seeded share of the training files, the same on every run and process.
        found = self._training_folder()
        count = len(found.files)
        val_size = round(self.hparams.val_fraction * count)
        if not 0 < val_size < count:
            raise ConfigError(
                f"--data.val_fraction {self.hparams.val_fraction} of the {count} images in {self.folders['train']} "
                "leaves no training or no validation image: add images, or a val/ folder"
            )
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.hparams.seed)).tolist()
        chosen = sorted(order[:val_size] if split == "val" else order[val_size:])
        return ImageFiles(
            files=tuple(found.files[i] for i in chosen),
            labels=tuple(found.labels[i] for i in chosen),
            class_names=found.class_names,
        )

    def _decode(self, found: ImageFiles) -> tuple[torch.Tensor, torch.Tensor]:
        _check_decoded_size(len(found.files), self.image_size)
        cache_dir = self.hparams.cache_dir
        images, kept = load_images(
            found.files,
            self.image_size,
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            skip_unreadable=self.hparams.skip_unreadable,
        )
        return images, torch.tensor([found.labels[i] for i in kept], dtype=torch.long)


# The splits each stage reads (predict: unless given --data.predict_path).
_SPLITS_OF = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}


def split_folders(root: Path) -> dict[str, Path | None]:
    """Where ``root``'s splits are: ``{"train": ..., "val": ... or None, "test": ... or None}``.

    ``root`` holds the splits when it has a ``train`` folder and no folders other than
    ``train``, ``val`` and ``test``; otherwise its folders are the classes.
    """
    if not root.is_dir():
        raise DataUnavailableError(
            f"--data.root {root} is not a folder: give a folder holding one folder of images per class"
        )
    names = {path.name for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")}
    if "train" in names and names <= set(SPLIT_FOLDERS):
        return {split: root / split if split in names else None for split in SPLIT_FOLDERS}
    return {"train": root, "val": None, "test": None}


def decoded_bytes(count: int, image_size: int) -> int:
    """Memory that ``count`` decoded images take: the ``uint8`` tensor, and as much again while it is assembled."""
    return 2 * count * 3 * image_size**2


def _check_decoded_size(count: int, image_size: int) -> None:
    """Refuse, before decoding, ``count`` images that would not fit in memory at ``image_size``."""
    check_memory(decoded_bytes(count, image_size), f"{count} decoded images", ["--data.image_size"], [image_size])


def _fills_every_split(size: int, val_fraction: float) -> bool:
    """Whether ``size`` synthetic images give a training, validation and test image each, split as in ``setup``."""
    return is_integer(size) and 0 < round(val_fraction * size) < size and size // 5 > 0


def _smallest_synthetic_size(val_fraction: float) -> int:
    """The fewest synthetic images that fill every split; any more do too."""
    # round(f * n) >= 1 once f * n > 0.5, and n - round(f * n) >= 1 once (1 - f) * n > 0.5. Rounding
    # half to even and floating point can move the exact answer by one either way.
    size = max(5, math.floor(0.5 / val_fraction) + 1, math.floor(0.5 / (1 - val_fraction)) + 1)
    while size > 5 and _fills_every_split(size - 1, val_fraction):
        size -= 1
    while not _fills_every_split(size, val_fraction):
        size += 1
    return size


def random_crop_flip(images: torch.Tensor, padding: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Randomly crop each image of a ``(B, C, H, W)`` batch after zero-padding, and mirror half of them.

    One gather does both: each output pixel reads its source pixel in the padded
    batch, so the batch is copied once, on whatever device it is.
    """
    B, C, H, W = images.shape
    padded_width = W + 2 * padding
    padded = F.pad(images, (padding, padding, padding, padding)).view(B, C, -1)
    # New tensors take the device of the batch, so this runs wherever the batch is.
    top = torch.randint(0, 2 * padding + 1, (B, 1, 1), device=images.device, generator=generator)
    left = torch.randint(0, 2 * padding + 1, (B, 1, 1), device=images.device, generator=generator)
    mirror = torch.rand(B, 1, 1, device=images.device, generator=generator) < 0.5
    rows = torch.arange(H, device=images.device).view(1, H, 1)
    cols = torch.arange(W, device=images.device).view(1, 1, W)
    cols = torch.where(mirror, W - 1 - cols, cols)
    source = ((top + rows) * padded_width + left + cols).view(B, 1, H * W)  # (B, 1, H*W) flat pixel indices
    return padded.gather(2, source.expand(B, C, H * W)).view(B, C, H, W)


def make_synthetic_images(num_images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate ``num_images`` learnable images: a smooth colour pattern per class, plus noise.

    Returns ``uint8`` images of shape ``(N, 3, 32, 32)`` and ``int64`` labels of shape ``(N,)``;
    the same ``seed`` always gives the same data.
    """
    patterns = torch.rand(NUM_CLASSES, 3, 4, 4, generator=torch.Generator().manual_seed(SYNTHETIC_PATTERN_SEED))
    patterns = F.interpolate(patterns, size=(32, 32), mode="bilinear", align_corners=False)
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(NUM_CLASSES, (num_images,), generator=generator)
    noise = 0.6 * torch.randn(num_images, 3, 32, 32, generator=generator)
    images = ((patterns[labels] + noise).clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


def ensure_cifar10(data_dir: Path) -> None:
    """Make sure ``data_dir`` holds CIFAR-10's complete extracted folder.

    The archive (placed by hand, or downloaded when absent) is extracted only when its MD5
    is CIFAR-10's. A folder with batch files missing is extracted again from the archive.
    """
    folder, archive = data_dir / CIFAR10_FOLDER, data_dir / CIFAR10_ARCHIVE
    if archive.exists() and (kind := kind_of(archive.stat().st_mode)) is not None:
        raise DataUnavailableError(
            f"{archive} is {kind}, not the CIFAR-10 archive: remove it, or put the archive there"
        )
    missing = [name for name in CIFAR10_BATCHES if not (folder / name).is_file()]
    if folder.is_dir() and not missing:
        return
    if folder.is_dir() and not archive.is_file():
        raise DataUnavailableError(
            f"{folder / missing[0]} is missing: {folder} is an incomplete CIFAR-10 folder. "
            f"Remove it to have CIFAR-10 downloaded again, or place {CIFAR10_ARCHIVE} in {data_dir}/."
        )
    if not archive.is_file():
        download_cifar10(data_dir)
    extract_cifar10(archive, data_dir)


def download_cifar10(data_dir: Path) -> None:
    """Download CIFAR-10's archive into ``data_dir``, under its own name only once its MD5 is checked.

    A download that stops half-way leaves no file that a later run would take for the archive.
    """
    from torchvision.datasets.utils import download_url

    partial = data_dir / f"{CIFAR10_ARCHIVE}.part"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        download_url(CIFAR10_URL, str(data_dir), filename=partial.name, md5=CIFAR10_MD5)
        partial.replace(data_dir / CIFAR10_ARCHIVE)
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        raise DataUnavailableError(
            f"CIFAR-10 is not in {data_dir}/ and could not be downloaded ({err}). "
            f"Place {CIFAR10_ARCHIVE} from {CIFAR10_URL} in {data_dir}/, "
            "or train on offline data with --data.dataset synthetic."
        ) from err
    finally:
        partial.unlink(missing_ok=True)


def extract_cifar10(archive: Path, data_dir: Path) -> None:
    """Check ``archive``'s MD5, then extract its ``cifar-10-batches-py`` folder into ``data_dir``.

    Extraction goes into a temporary folder inside ``data_dir``, removed whatever happens, and
    the folder is renamed into place only when complete: a damaged archive or a stopped run
    never leaves a partial folder where the next run looks. An incomplete folder is replaced.
    """
    found = file_md5(archive)
    if found != CIFAR10_MD5:
        raise DataUnavailableError(
            f"{archive} is not the CIFAR-10 archive: its MD5 is {found}, not {CIFAR10_MD5}. "
            f"Download it again from {CIFAR10_URL}, or remove it to have it downloaded."
        )
    scratch = Path(tempfile.mkdtemp(prefix=f".{CIFAR10_FOLDER}-", dir=data_dir))
    try:
        try:
            _extract_members(archive, scratch)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise DataUnavailableError(
                f"{archive} could not be extracted into {data_dir}/ ({err}), and nothing of it was kept. "
                "Check the space and permissions there, or remove the archive to have it downloaded again."
            ) from err
        extracted, target = scratch / CIFAR10_FOLDER, data_dir / CIFAR10_FOLDER
        missing = [name for name in CIFAR10_BATCHES if not (extracted / name).is_file()]
        if missing:
            raise DataUnavailableError(
                f"{archive} has no {CIFAR10_FOLDER}/{missing[0]}: it is not the CIFAR-10 archive. "
                f"Download it again from {CIFAR10_URL}, or remove it to have it downloaded."
            )
        if target.exists() or target.is_symlink():
            target.rename(scratch / "incomplete")  # removed with the temporary folder
        extracted.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract_members(archive: Path, into: Path) -> None:
    """Extract ``archive`` into ``into``, refusing any member but files and folders inside ``cifar-10-batches-py/``."""
    # PEP 706's "data" filter (Python 3.10.12, 3.11.4, 3.12 and later) also refuses links
    # out of `into` and drops special permissions; the check below covers older versions.
    options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with open_regular(archive) as file, tarfile.open(fileobj=file, mode="r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name.replace("\\", "/")).parts
            if parts[:1] != (CIFAR10_FOLDER,) or ".." in parts or not (member.isfile() or member.isdir()):
                raise DataUnavailableError(
                    f"{archive} holds {member.name!r}, not a file or folder inside {CIFAR10_FOLDER}/: "
                    "it is not the CIFAR-10 archive, and nothing of it was kept. Remove it."
                )
            tar.extract(member, into, **options)


def file_md5(path: Path) -> str:
    """The MD5 digest of the file at ``path``, as hexadecimal."""
    digest = hashlib.md5(usedforsecurity=False)  # a checksum, not a security measure
    with open_regular(path) as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_cifar10_batches(folder: Path, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Read CIFAR-10's Python-format batch files into ``uint8`` images ``(N, 3, 32, 32)`` and labels ``(N,)``."""
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            raise DataUnavailableError(f"{path} is missing: {folder} is not a complete CIFAR-10 folder.")
        try:
            with open_regular(path) as file:
                batch = _BatchUnpickler(file, encoding="latin1").load()
        except NotAFileError as err:
            raise DataUnavailableError(
                f"{err}: {folder} is not a CIFAR-10 folder. Remove it to have it extracted again."
            ) from err
        images.append(torch.as_tensor(batch["data"], dtype=torch.uint8).view(-1, 3, 32, 32))
        labels.append(torch.as_tensor(batch["labels"], dtype=torch.long))
    return torch.cat(images), torch.cat(labels)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles CIFAR-10 batches (dicts of lists and NumPy arrays) and refuses anything else.

    CIFAR-10 ships as pickles; this loader never runs code a tampered file might name.
    """

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            # How Python 3 writes bytes at pickle protocol 2; it only encodes a string.
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR-10 batch file")
        return super().find_class(module, name)
