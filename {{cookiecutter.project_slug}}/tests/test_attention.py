"""The attention classifier: token ids to logits up to max_len, positions in a buffer, and it learns order."""

import lightning as L
import pytest
import torch

from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.data.sequences import SequenceDataModule
from {{ cookiecutter.project_slug }}.models.attention import AttentionClassifier


def test_attention_classifier_maps_tokens_to_logits():
    """(B, T) token ids give (B, classes) logits, for any T up to max_len."""
    model = AttentionClassifier(vocab_size=16, num_classes=3, max_len=32)
    for length in (1, 7, 32):
        logits = model(torch.randint(0, 16, (5, length)))
        assert logits.shape == (5, 3)
        assert torch.isfinite(logits).all()


def test_too_long_sequences_are_refused_with_the_limit():
    model = AttentionClassifier(max_len=8)
    with pytest.raises(AssertionError, match="exceeds max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_position_indices_are_a_buffer_outside_the_checkpoint():
    """The seed's arange(seqlen) is built once as a buffer; it moves with the model and is not saved."""
    model = AttentionClassifier(max_len=12)
    assert torch.equal(dict(model.named_buffers())["positions"], torch.arange(12))
    assert "positions" not in model.state_dict()


@pytest.mark.slow
def test_attention_classifier_learns_the_order_task():
    """A one-block network reaches at least 90% validation accuracy on 8-token sequences in three CPU epochs."""
    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    net = AttentionClassifier(vocab_size=8, max_len=8, d_model=32, num_heads=2, num_layers=1)
    datamodule = SequenceDataModule(vocab_size=8, seq_len=8, num_sequences=2000)
    trainer.fit(Classifier(net, num_classes=2, lr=3e-3), datamodule=datamodule)
    assert trainer.callback_metrics["val/acc"] >= 0.9
