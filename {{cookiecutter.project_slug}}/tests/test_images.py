"""ImageDataModule: seeded, disjoint splits, whole batches in order, and arguments checked where they enter."""

import re

import pytest
import torch
from conftest import refused

from {{ cookiecutter.project_slug }}.data.images import ImageDataModule


def test_splits_are_disjoint_and_seeded():
    """Validation holds val_fraction of the training images; the split is the same for the same seed."""
    first = ImageDataModule(dataset="synthetic", synthetic_size=500, val_fraction=0.2, seed=3)
    second = ImageDataModule(dataset="synthetic", synthetic_size=500, val_fraction=0.2, seed=3)
    for dm in (first, second):
        dm.setup("fit")
    train, val = first.splits["train"].tensors[0], first.splits["val"].tensors[0]
    assert (len(train), len(val), len(first.splits["test"])) == (400, 100, 100)
    assert torch.equal(val, second.splits["val"].tensors[0])
    flat_train = {bytes(image.flatten().tolist()) for image in train}
    assert not any(bytes(image.flatten().tolist()) in flat_train for image in val)


def test_loaders_yield_full_batches_in_order():
    """Validation batches come in order, batch_size at a time, as uint8 images and int64 labels."""
    dm = ImageDataModule(dataset="synthetic", synthetic_size=300, batch_size=16)
    dm.setup("fit")
    batches = list(dm.val_dataloader())
    images, labels = batches[0]
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.long
    assert torch.equal(torch.cat([b[0] for b in batches]), dm.splits["val"].tensors[0])


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        ({"dataset": "imagenet"}, "dataset"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"dataset": "synthetic", "synthetic_size": 0}, "synthetic_size"),
        ({"dataset": "synthetic", "synthetic_size": 5}, "synthetic_size"),
        ({"dataset": "synthetic", "synthetic_size": 100, "val_fraction": 0.001}, "synthetic_size"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(capsys, arguments, flag):
    """Each value out of range stops the command line with one line that starts with its --data flag: a value out
    of its type's bounds as it is parsed, one that does not go with the others as the data module is built."""
    flags = [text for name, value in arguments.items() for text in (f"--data.{name}", str(value))]
    assert re.match(rf"error: --data\.{flag}( must be |: )", refused(flags, capsys))
