"""On-device augmentation: random crops and flips of a whole batch at once, wherever the batch is."""

import torch
import torch.nn.functional as F


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
