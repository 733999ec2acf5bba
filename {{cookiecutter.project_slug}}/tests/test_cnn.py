"""The reference CNN: the seed's layers, uint8 images in, normalisation in its buffers, and it learns."""

import lightning as L
import pytest
import torch
from torch import nn

from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule
from {{ cookiecutter.project_slug }}.models.cnn import ReferenceCNN


def test_reference_cnn_is_the_seed_network_layer_for_layer():
    """The layers are exactly the seed's: three conv/pool pairs, flatten, two linear layers."""
    expected = [
        (nn.Conv2d, dict(in_channels=3, out_channels=32, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Conv2d, dict(in_channels=32, out_channels=32, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Conv2d, dict(in_channels=32, out_channels=64, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Flatten, {}),
        (nn.Linear, dict(in_features=1024, out_features=64)),
        (nn.Linear, dict(in_features=64, out_features=10)),
    ]
    layers = list(ReferenceCNN().layers)
    assert [type(layer) for layer in layers] == [cls for cls, _ in expected]
    for layer, (_, attributes) in zip(layers, expected, strict=True):
        for name, value in attributes.items():
            assert getattr(layer, name) == value, (layer, name)


def test_reference_cnn_maps_uint8_images_to_logits():
    """A (B, 3, 32, 32) uint8 batch gives (B, 10) finite logits; float input on the 0-255 scale gives the same."""
    model = ReferenceCNN()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    logits = model(images)
    assert logits.shape == (4, 10)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(model(images.float()), logits)


def test_normalisation_statistics_are_buffers_saved_in_the_checkpoint():
    """Mean and std move with the module, and a checkpoint restores the ones it was trained with."""
    trained = ReferenceCNN(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6))
    assert {"mean", "std"} <= dict(trained.named_buffers()).keys()
    restored = ReferenceCNN()
    restored.load_state_dict(trained.state_dict())
    torch.testing.assert_close(restored.mean, trained.mean)
    torch.testing.assert_close(restored.std, trained.std)


@pytest.mark.slow
def test_reference_cnn_learns_the_synthetic_images():
    """One CPU epoch on 2,000 synthetic images reaches at least 90% validation accuracy."""
    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    datamodule = ImageDataModule(dataset="synthetic", synthetic_size=2000)
    trainer.fit(Classifier(ReferenceCNN(), num_classes=10), datamodule=datamodule)
    assert trainer.callback_metrics["val/acc"] >= 0.9
