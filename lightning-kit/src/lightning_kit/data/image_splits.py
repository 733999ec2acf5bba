"""The base of the image data modules."""

import torch

from ..arguments import BatchSize, Seed, Workers, check_memory
from .augment import random_crop_flip
from .image_decoding import load_images
from .image_files import ImageFiles, list_images
from .memory import InMemoryDataModule, InMemoryDataset


class ImageSplits(InMemoryDataModule):
    """What the image data modules share: square RGB ``uint8`` images, augmented on the accelerator, and
    predictions on image files. Subclasses set ``image_size`` and call ``self.setup_predict(stage)`` from ``setup``.

    Args:
        augment: Random crop (an eighth of the size as padding) and horizontal flip on training batches.
        predict_path: What ``predict`` runs on: an image file, a folder of them (labelled when its
            subfolders are class names), or a ``.txt`` list of image paths. By default the test split.
        skip_unreadable: Skip files that cannot be decoded (each reported) instead of stopping.
    """

    def __init__(
        self,
        batch_size: BatchSize = 64,
        seed: Seed = 42,
        num_workers: Workers = 0,
        augment: bool = True,
        predict_path: str | None = None,
        skip_unreadable: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, seed=seed, num_workers=num_workers)
        self.augment_batches, self.predict_path, self.skip_unreadable = augment, predict_path, skip_unreadable

    def setup_predict(self, stage: str) -> bool:
        """Read ``predict_path``'s images for ``predict``; whether it did (then no other split is needed)."""
        path = self.predict_path
        if stage != "predict" or not path:
            return False
        if "predict" not in self.splits:
            found = list_images(path, self.class_names)
            images, labels, kept = self.decode_files(found)
            self.splits["predict"] = InMemoryDataset(images, labels)
            self.predict_names = [str(found.files[i]) for i in kept]
            self.predict_labelled = found.labels is not None
        return True

    def decode_files(self, found: ImageFiles, cache_dir: str | None = None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """``found``'s images at ``image_size`` (refused first where they would not fit in memory), the labels of
        those kept (-1 where the files have none), and the indices of those kept (``load_images``)."""
        check_decoded_size(len(found.files), self.image_size)
        images, kept = load_images(found.files, self.image_size, cache_dir, skip_unreadable=self.skip_unreadable)
        labels = torch.tensor([found.labels[i] if found.labels else -1 for i in kept], dtype=torch.long)
        return images, labels, kept

    def predicting_files(self) -> bool:
        """Whether this run is ``predict`` on ``predict_path``'s files, which needs no other data."""
        trainer = self.trainer
        return bool(self.predict_path) and trainer is not None and trainer.state.fn == "predict"

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # Runs on the accelerator, after Lightning has moved the batch there.
        trainer = self.trainer
        if self.augment_batches and trainer is not None and trainer.training:
            return self.augment(batch, step=trainer.global_step, rank=trainer.global_rank)
        return batch

    def augment(self, batch: tuple[torch.Tensor, torch.Tensor], step: int, rank: int = 0):
        """Random crops (padding of an eighth of the size) and flips of a training batch, where it is, drawn from the
        seed, the process and the step: a resumed run augments exactly as one that never stopped."""
        images, labels = batch
        generator = torch.Generator(device=images.device).manual_seed(hash((self.seed, rank, step)) % 2**63)
        padding = max(1, images.shape[-1] // 8)
        return random_crop_flip(images, padding=padding, generator=generator), labels


def check_decoded_size(count: int, image_size: int) -> None:
    """Refuse, before decoding, ``count`` images that would not fit in memory at ``image_size``: the ``uint8``
    tensor, and as much again while it is assembled."""
    what = "one decoded image" if count == 1 else f"{count} decoded images"
    check_memory(2 * count * 3 * image_size**2, what, ["--data.image_size"], [image_size])
