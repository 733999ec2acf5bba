"""Synthetic images: the same for the same seed, and the smallest size named is the smallest that fills every split."""

import pytest
import torch
from lightning_kit.building import build
from lightning_kit.errors import ConfigError

from {{ cookiecutter.project_slug }}.cli import ProjectCLI
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule
from {{ cookiecutter.project_slug }}.data.synthetic import make_synthetic_images


def test_synthetic_images_are_deterministic_uint8():
    """The same seed gives the same images; another seed gives others."""
    images, labels = make_synthetic_images(64, seed=0)
    again, again_labels = make_synthetic_images(64, seed=0)
    other, _ = make_synthetic_images(64, seed=1)
    assert images.dtype == torch.uint8 and images.shape == (64, 3, 32, 32)
    assert labels.dtype == torch.long and labels.min() >= 0 and labels.max() < 10
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    assert not torch.equal(images, other)


def test_the_smallest_synthetic_size_named_is_the_smallest_that_works():
    """At val_fraction 0.1, 5 images are refused with "at least 6", and 6 give one validation and one test image."""
    with pytest.raises(ConfigError, match=r"at least 6 at --data\.val_fraction 0\.1,"):
        ImageDataModule(dataset="synthetic", synthetic_size=5)
    dm = ImageDataModule(dataset="synthetic", synthetic_size=6)
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (5, 1, 1)


def test_a_bad_size_on_the_command_line_is_one_line_naming_the_flag(in_tmp_path, synthetic_config):
    """`--data.synthetic_size 0` ends in "error: --data.synthetic_size ...", not a traceback blaming val_fraction."""
    with pytest.raises(SystemExit) as exit_info:
        build(ProjectCLI, ["--config", synthetic_config, "--data.synthetic_size", "0"])
    assert str(exit_info.value.code).startswith("error: --data.synthetic_size must be an integer of at least 6")
