"""On-device augmentation: each image a shifted or mirrored crop, computed where the batch is."""

import torch

from lightning_kit.data.augment import random_crop_flip
from lightning_kit.gpu_audit import SIMULATED, run_on_simulated_gpu


def test_random_crop_flip_gives_shifted_or_mirrored_crops():
    """Each augmented image is a 32x32 window of the zero-padded input, mirrored or not; the windows vary."""
    torch.manual_seed(0)
    batch = torch.randint(1, 256, (16, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(batch, padding=4)
    assert out.shape == batch.shape and out.dtype == batch.dtype
    padded = torch.nn.functional.pad(batch, (4, 4, 4, 4))
    found = set()
    for i in range(len(batch)):
        matches = [
            (top, left, flip)
            for top in range(9)
            for left in range(9)
            for flip in (False, True)
            if torch.equal(
                out[i], (lambda w: w.flip(-1) if flip else w)(padded[i, :, top : top + 32, left : left + 32])
            )
        ]
        assert matches, f"image {i} is not a crop of its padded input"
        found.add(matches[0])
    assert len(found) > 4, "crops should differ between images"


def test_augmentation_runs_where_the_batch_is():
    """On a (simulated) GPU, the crops and flips stay on the GPU: every index they build takes the batch's device."""
    out = run_on_simulated_gpu(random_crop_flip, torch.zeros(8, 3, 32, 32, dtype=torch.uint8), padding=4)
    assert out.device.type == SIMULATED and out.shape == (8, 3, 32, 32)
