import lightning as L
import numpy as np
import pytest
import torch

from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.data import DataUnavailableError
from {{ cookiecutter.project_slug }}.data.sequences import (
    FIRST_MARKER,
    SECOND_MARKER,
    SequenceDataModule,
    make_order_task,
)
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


def test_order_task_labels_say_which_marker_comes_first():
    tokens, labels = make_order_task(200, seq_len=10, vocab_size=6, seed=0)
    assert tokens.shape == (200, 10) and labels.shape == (200,)
    assert ((tokens == FIRST_MARKER).sum(1) == 1).all() and ((tokens == SECOND_MARKER).sum(1) == 1).all()
    first = (tokens == FIRST_MARKER).long().argmax(1)
    second = (tokens == SECOND_MARKER).long().argmax(1)
    assert torch.equal(labels, (first < second).long())
    assert 0.3 < labels.float().mean() < 0.7
    again, _ = make_order_task(200, seq_len=10, vocab_size=6, seed=0)
    assert torch.equal(tokens, again)


def test_order_task_cannot_be_solved_without_positions():
    """Reversing a sequence keeps its tokens and flips its label: only order tells the classes apart."""
    tokens, labels = make_order_task(100, seq_len=10, vocab_size=6, seed=1)
    reversed_tokens = tokens.flip(1)
    reversed_first = (reversed_tokens == FIRST_MARKER).long().argmax(1)
    reversed_second = (reversed_tokens == SECOND_MARKER).long().argmax(1)
    assert torch.equal((reversed_first < reversed_second).long(), 1 - labels)
    assert torch.equal(tokens.sort(1).values, reversed_tokens.sort(1).values)


def test_sequences_load_from_an_npz_file(tmp_path):
    """A file of tokens and labels is split 80/10/10 with the seed and keeps every row."""
    tokens = np.random.default_rng(0).integers(0, 16, (50, 32))
    labels = np.arange(50) % 2
    path = tmp_path / "sequences.npz"
    np.savez(path, tokens=tokens, labels=labels)
    dm = SequenceDataModule(dataset="file", path=str(path))
    dm.setup("fit")
    sizes = {name: len(split) for name, split in dm.splits.items()}
    assert sizes == {"train": 40, "val": 5, "test": 5}
    rows = torch.cat([split.tensors[0] for split in dm.splits.values()])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, tokens.tolist()))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"tokens": np.zeros((4, 8), dtype=np.int64)}, "lacks the array"),
        ({"tokens": np.zeros((4, 8)), "labels": np.zeros(4, dtype=np.int64)}, "must be integers"),
        ({"tokens": np.full((4, 8), 99), "labels": np.zeros(4, dtype=np.int64)}, r"token ids must lie in \[0, 16\)"),
        ({"tokens": np.zeros((4, 8), dtype=np.int64), "labels": np.full(4, 5)}, r"labels must lie in \[0, 2\)"),
        ({"tokens": np.zeros((4, 8), dtype=np.int64), "labels": np.zeros(3, dtype=np.int64)}, "must be"),
    ],
)
def test_malformed_files_are_refused_with_the_reason(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message):
        SequenceDataModule(dataset="file", path=str(path)).setup("fit")


def test_a_missing_file_says_how_to_make_one(tmp_path):
    dm = SequenceDataModule(dataset="file", path=str(tmp_path / "nowhere.npz"))
    with pytest.raises(DataUnavailableError, match=r"numpy\.savez.*--data\.dataset synthetic"):
        dm.setup("fit")


@pytest.mark.slow
def test_attention_classifier_learns_the_order_task():
    """Three CPU epochs on the order task reach at least 90% validation accuracy, far above chance."""
    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(AttentionClassifier(), num_classes=2, lr=3e-3), datamodule=SequenceDataModule())
    assert trainer.callback_metrics["val/acc"] >= 0.9
