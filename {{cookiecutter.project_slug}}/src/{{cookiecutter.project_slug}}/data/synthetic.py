"""Synthetic images: an offline stand-in for CIFAR-10 that a small network learns, the same for the same seed."""

import math

import torch
import torch.nn.functional as F

# As many classes as CIFAR-10, so either data set fits the same network.
NUM_CLASSES = 10
# The synthetic classes' patterns are the same for every split and every seed.
SYNTHETIC_PATTERN_SEED = 1234


def make_synthetic_images(num_images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate ``num_images`` learnable images: a smooth colour pattern per class, plus noise.

    Returns ``uint8`` images of shape ``(N, 3, 32, 32)`` and ``int64`` labels of shape ``(N,)``;
    the same ``seed`` always gives the same data.
    """
    patterns = torch.rand(NUM_CLASSES, 3, 4, 4, generator=torch.Generator().manual_seed(SYNTHETIC_PATTERN_SEED))
    patterns = F.interpolate(patterns, size=(32, 32), mode="bilinear", align_corners=False)
    generator = torch.Generator().manual_seed(seed)
    labels = _draw_labels(num_images, generator)
    noise = 0.6 * torch.randn(num_images, 3, 32, 32, generator=generator)
    images = ((patterns[labels] + noise).clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


def synthetic_labels(num_images: int, seed: int) -> torch.Tensor:
    """The labels of ``make_synthetic_images(num_images, seed)``, without making the images."""
    return _draw_labels(num_images, torch.Generator().manual_seed(seed))


def _draw_labels(num_images: int, generator: torch.Generator) -> torch.Tensor:
    # The first draw from the seed's generator, so the labels can be known before the images are made.
    return torch.randint(NUM_CLASSES, (num_images,), generator=generator)


def fills_every_split(size: int, val_fraction: float) -> bool:
    """Whether ``size`` synthetic images give a training, validation and test image each, split as in ``setup``."""
    return 0 < round(val_fraction * size) < size and size // 5 > 0


def smallest_synthetic_size(val_fraction: float) -> int:
    """The fewest synthetic images that fill every split; any more do too."""
    # round(f * n) >= 1 once f * n > 0.5, and n - round(f * n) >= 1 once (1 - f) * n > 0.5. Rounding
    # half to even and floating point can move the exact answer by one either way.
    size = max(5, math.floor(0.5 / val_fraction) + 1, math.floor(0.5 / (1 - val_fraction)) + 1)
    while size > 5 and fills_every_split(size - 1, val_fraction):
        size -= 1
    while not fills_every_split(size, val_fraction):
        size += 1
    return size
