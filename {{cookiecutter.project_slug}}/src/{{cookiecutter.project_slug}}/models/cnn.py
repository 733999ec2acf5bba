"""The reference CNN for CIFAR-10 (3x32x32 images, 10 classes), and for square RGB images of other sizes."""

from collections.abc import Sequence

import torch
from jsonargparse.typing import ClosedUnitInterval, restricted_number_type
from lightning_kit.arguments import ImageSize, NumClasses, check_memory
from torch import nn

# Per-channel statistics of the CIFAR-10 training images, in [0, 1] units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# Parameters of the three convolutions, whatever the image size.
CONV_PARAMETERS = (3 * 25 + 1) * 32 + (32 * 25 + 1) * 32 + (32 * 25 + 1) * 64
# A standard deviation in [0, 1] units, which the network divides by: above 0.
UnitStd = restricted_number_type("UnitStd", float, [(">", 0), ("<=", 1)])


def parameter_count(num_classes: int, image_size: int) -> int:
    """The network's parameters: the first linear layer grows with the square of the image size."""
    return CONV_PARAMETERS + (64 * (image_size // 8) ** 2 + 1) * 64 + (64 + 1) * num_classes


class ReferenceCNN(nn.Module):
    """The seed's CIFAR-10 network, layer for layer.

    It has no activation functions: that is the reference as published. It takes
    raw ``uint8`` images and normalises them itself, so batches cross to the
    accelerator at a quarter of the size of ``float32`` ones, and the statistics
    live in buffers that move with the module.

    Args:
        num_classes: Outputs, one logit per class (set by the data).
        image_size: Height and width of the input images, at least 8 (set by the data); the
            first linear layer's size follows from it (32, CIFAR-10's, gives the reference).
        mean: Per-channel mean of the training images in [0, 1] units. Data that measures
            its own (image folders) replaces it when training starts (``normalize_with``).
        std: Per-channel standard deviation, likewise; each in (0, 1].

    What each argument accepts is in its type, which the command line checks where the value is given.
    """

    def __init__(
        self,
        num_classes: NumClasses = 10,
        image_size: ImageSize = 32,
        mean: tuple[ClosedUnitInterval, ClosedUnitInterval, ClosedUnitInterval] = CIFAR10_MEAN,
        std: tuple[UnitStd, UnitStd, UnitStd] = CIFAR10_STD,
    ) -> None:
        # A ValueError naming the arguments: the command line that built the network names their flags.
        sizes = {"num_classes": num_classes, "image_size": image_size}
        check_memory(4 * parameter_count(**sizes), "the network", list(sizes), list(sizes.values()), ValueError)
        super().__init__()
        self.num_classes = num_classes
        self.image_size = image_size
        # Constants used in forward are buffers, so Lightning places them with the
        # parameters. They are statistics measured on the training data, so they are saved
        # in checkpoints: a checkpoint evaluates with the normalisation it was trained with.
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1) * 255)
        self.layers = nn.Sequential(
            nn.Conv2d(3, 32, 5, 1, 2),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 5, 1, 2),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, 1, 2),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (image_size // 8) ** 2, 64),
            nn.Linear(64, num_classes),
        )

    @torch.no_grad()
    def normalize_with(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Normalise with these per-channel statistics (in [0, 1] units) from now on."""
        # copy_ writes into the buffers wherever they are: no device named here.
        self.mean.copy_(torch.tensor(mean).view(1, 3, 1, 1) * 255)
        self.std.copy_(torch.tensor(std).view(1, 3, 1, 1) * 255)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Map ``(B, 3, S, S)`` images (``uint8`` 0-255, or floats on that scale) to ``(B, classes)`` logits."""
        size = self.image_size
        assert images.shape[1:] == (3, size, size), f"expected (B, 3, {size}, {size}) images, got {tuple(images.shape)}"
        x = (images.float() - self.mean) / self.std
        return self.layers(x)
