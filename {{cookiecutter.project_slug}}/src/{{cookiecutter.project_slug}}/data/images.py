"""Image data: CIFAR-10, or an offline synthetic stand-in, held in memory as uint8."""

import pickle
import urllib.error
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from . import DataUnavailableError, InMemoryDataModule, InMemoryDataset

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
NUM_CLASSES = 10
# The synthetic classes' patterns are the same for every split and every seed.
SYNTHETIC_PATTERN_SEED = 1234


class ImageDataModule(InMemoryDataModule):
    """CIFAR-10 (``dataset="cifar10"``) or synthetic images (``dataset="synthetic"``).

    Each split is one ``uint8`` tensor of shape ``(N, 3, 32, 32)``: the loaders only
    slice batches, which Lightning moves to the accelerator, where random crops and
    flips are applied to whole training batches at once.

    Args:
        dataset: ``"cifar10"`` (downloaded into ``data_dir`` when missing) or
            ``"synthetic"`` (generated from ``seed``, nothing read or downloaded).
        data_dir: Folder holding ``cifar-10-python.tar.gz`` or its extracted folder.
        batch_size: Images per batch, per device.
        val_fraction: Share of the training images held out for validation, chosen with ``seed``.
        synthetic_size: Images in the synthetic training split (the test split has a fifth of that).
        augment: Random crop (4 pixels of padding) and horizontal flip on training batches.
        num_workers: Loader processes; slicing in-memory tensors needs none.
        seed: Seed of the train/validation split and of the synthetic images.
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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = NUM_CLASSES

    def prepare_data(self) -> None:
        if self.hparams.dataset == "cifar10":
            ensure_cifar10(Path(self.hparams.data_dir))

    def setup(self, stage: str) -> None:
        if self.splits:
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
            raise ValueError(f"val_fraction={self.hparams.val_fraction} leaves no training or no validation images")
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.seed))
        val_idx, train_idx = order[:val_size], order[val_size:]
        self.splits = {
            "train": InMemoryDataset(images[train_idx], labels[train_idx]),
            "val": InMemoryDataset(images[val_idx], labels[val_idx]),
            "test": InMemoryDataset(*test),
        }

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # Runs on the accelerator, after Lightning has moved the batch there.
        trainer = self.trainer
        if self.hparams.augment and trainer is not None and trainer.training:
            return self.augment(batch, step=trainer.global_step, rank=trainer.global_rank)
        return batch

    def augment(self, batch: tuple[torch.Tensor, torch.Tensor], step: int, rank: int = 0):
        """Random crops and flips of a training batch, where the batch is.

        The random numbers are drawn from the seed, the process and the step, so a
        resumed run augments exactly as one that never stopped.
        """
        images, labels = batch
        generator = torch.Generator(device=images.device)
        generator.manual_seed(hash((self.hparams.seed, rank, step)) % 2**63)
        return random_crop_flip(images, padding=4, generator=generator), labels


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
    """Make sure ``data_dir`` holds CIFAR-10's extracted batches: extract a placed archive, or download it."""
    if (data_dir / CIFAR10_FOLDER).is_dir():
        return
    from torchvision.datasets.utils import download_and_extract_archive, extract_archive

    archive = data_dir / CIFAR10_ARCHIVE
    if archive.is_file():
        extract_archive(str(archive), str(data_dir))
        return
    try:
        download_and_extract_archive(CIFAR10_URL, str(data_dir), filename=CIFAR10_ARCHIVE, md5=CIFAR10_MD5)
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        raise DataUnavailableError(
            f"CIFAR-10 is not in {data_dir}/ and could not be downloaded ({err}). "
            f"Place {CIFAR10_ARCHIVE} from {CIFAR10_URL} in {data_dir}/, "
            "or train on offline data with --data.dataset synthetic."
        ) from err


def read_cifar10_batches(folder: Path, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Read CIFAR-10's Python-format batch files into ``uint8`` images ``(N, 3, 32, 32)`` and labels ``(N,)``."""
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise DataUnavailableError(f"{path} is missing: {folder} is not a complete CIFAR-10 folder.")
        with path.open("rb") as file:
            batch = _BatchUnpickler(file, encoding="latin1").load()
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
