"""The reference CNN for CIFAR-10 (3x32x32 images, 10 classes)."""

import torch
from torch import nn

# Per-channel statistics of the CIFAR-10 training images, in [0, 1] units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class ReferenceCNN(nn.Module):
    """The seed's CIFAR-10 network, layer for layer.

    It has no activation functions: that is the reference as published. It takes
    raw ``uint8`` images and normalises them itself, so batches cross to the
    accelerator at a quarter of the size of ``float32`` ones, and the statistics
    live in buffers that move with the module.
    """

    def __init__(
        self,
        num_classes: int = 10,
        mean: tuple[float, float, float] = CIFAR10_MEAN,
        std: tuple[float, float, float] = CIFAR10_STD,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
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
            nn.Linear(64 * 4 * 4, 64),
            nn.Linear(64, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Map ``(B, 3, 32, 32)`` images (``uint8`` 0-255, or floats on that scale) to ``(B, classes)`` logits."""
        assert images.shape[1:] == (3, 32, 32), f"expected (B, 3, 32, 32) images, got {tuple(images.shape)}"
        x = (images.float() - self.mean) / self.std
        return self.layers(x)
