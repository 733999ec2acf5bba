"""SequenceDataModule: the order task, .npz files checked and read, arguments checked where they enter."""

import re

import numpy as np
import pytest
import torch
from conftest import refused
from lightning_kit.building import build
from lightning_kit.data import DataUnavailableError
from lightning_kit.errors import ConfigError

from {{ cookiecutter.project_slug }}.cli import ProjectCLI
from {{ cookiecutter.project_slug }}.data.sequences import (
    FIRST_MARKER,
    SECOND_MARKER,
    SequenceDataModule,
    make_order_task,
)


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


def test_a_file_keeps_its_integer_types_values_and_split(tmp_path):
    """uint8 tokens and bool labels are read as int64 with the same values, and split as int64 data is."""
    tokens = np.random.default_rng(1).integers(0, 16, (30, 12)).astype(np.uint8)
    labels = np.arange(30) % 2 == 0
    np.savez(tmp_path / "small.npz", tokens=tokens, labels=labels)
    np.savez(tmp_path / "wide.npz", tokens=tokens.astype(np.int64), labels=labels.astype(np.int64))
    small, wide = (SequenceDataModule(dataset="file", path=str(tmp_path / name)) for name in ("small.npz", "wide.npz"))
    for dm in (small, wide):
        dm.setup("fit")
    for name, split in small.splits.items():
        assert all(t.dtype == torch.long for t in split.tensors)
        assert all(torch.equal(a, b) for a, b in zip(split.tensors, wide.splits[name].tensors, strict=True))


def _int(*shape: int, fill: int = 0) -> np.ndarray:
    return np.full(shape, fill, dtype=np.int64)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"tokens": _int(4, 8)}, r"lacks the array\(s\) \['labels'\]; it has \['tokens'\]"),
        ({"tokens": np.zeros((4, 8)), "labels": _int(4)}, "tokens must be integers, got float64"),
        ({"tokens": _int(4, 8), "labels": np.zeros(4, dtype=np.float32)}, "labels must be integers, got float32"),
        ({"tokens": np.full((4, 8), "a"), "labels": _int(4)}, "tokens must be integers"),
        ({"tokens": _int(4, 8, fill=99), "labels": _int(4)}, r"token ids must lie in \[0, 16\) of --data\.vocab_size"),
        ({"tokens": _int(4, 8, fill=-1), "labels": _int(4)}, r"found \[-1, -1\]"),
        ({"tokens": _int(4, 8), "labels": _int(4, fill=5)}, r"labels must lie in \[0, 2\) of --data\.num_classes"),
        ({"tokens": _int(4, 8), "labels": _int(3)}, r"tokens must be \(N, T\).*got \(4, 8\) and \(3,\)"),
        ({"tokens": _int(32), "labels": _int(32)}, r"tokens must be \(N, T\)"),
        ({"tokens": _int(4, 0), "labels": _int(4)}, r"T >= 1"),
        ({"tokens": _int(0, 8), "labels": _int(0)}, "holds no sequences"),
        ({"tokens": _int(4, 33), "labels": _int(4)}, r"sequences of 33 tokens, longer than --data\.seq_len 32"),
        ({"tokens": _int(5, 8), "labels": _int(5)}, r"holds 5 sequences, too few .* \(6 or more do\)"),
    ],
)
def test_malformed_files_are_refused_with_the_reason(tmp_path, arrays, message):
    """Each problem with a file's arrays stops setup with one line naming the file and what is wrong."""
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=message) as caught:
        SequenceDataModule(dataset="file", path=str(path)).setup("fit")
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def _damaged_npz(path):
    np.savez(path, tokens=_int(4, 8), labels=_int(4))
    data = bytearray(path.read_bytes())
    data[60:70] = bytes(10)  # inside the first array's stored bytes: its CRC no longer matches
    path.write_bytes(bytes(data))


def _truncated_npz(path):
    np.savez(path, tokens=_int(4, 8), labels=_int(4))
    path.write_bytes(path.read_bytes()[:-30])


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda path: path.write_bytes(b""), "is empty"),
        (lambda path: path.write_text("tokens,labels\n1,0\n"), "is not an .npz file"),
        (lambda path: np.save(path.open("wb"), _int(4, 8)), "is not an .npz file"),
        (_truncated_npz, "is not an .npz file, or is damaged"),
        (_damaged_npz, "could not be read as an .npz file"),
        (lambda path: np.savez(path, tokens=np.array([[1]], dtype=object), labels=_int(1)), "could not be read"),
    ],
    ids=["empty", "text", "npy", "truncated", "damaged", "pickled"],
)
def test_unreadable_files_are_refused_with_the_reason(tmp_path, write, message):
    """A file that is not a readable .npz stops setup with one line naming it and how to write one."""
    path = tmp_path / "bad.npz"
    write(path)
    with pytest.raises(DataUnavailableError, match=rf"{message}.*numpy\.savez") as caught:
        SequenceDataModule(dataset="file", path=str(path)).setup("fit")
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_missing_file_says_how_to_make_one(tmp_path):
    """A path to no file names numpy.savez and the offline alternative."""
    dm = SequenceDataModule(dataset="file", path=str(tmp_path / "nowhere.npz"))
    with pytest.raises(DataUnavailableError, match=r"numpy\.savez.*--data\.dataset synthetic"):
        dm.setup("fit")


def test_a_fifo_or_a_folder_for_sequences_is_refused_by_name(tmp_path, make_fifo):
    """The data file and predict_path are read only when plain files: a FIFO would never end, a folder is none."""
    fifo, folder = make_fifo(tmp_path / "pipe.npz"), tmp_path / "folder.npz"
    folder.mkdir()
    for path, kind in [(fifo, "a FIFO (named pipe)"), (folder, "a folder")]:
        expected = "^" + re.escape(f"{path} is {kind}, not a file. Save your data with numpy.savez")
        with pytest.raises(DataUnavailableError, match=expected):
            SequenceDataModule(dataset="file", path=str(path)).setup("fit")
        with pytest.raises(DataUnavailableError, match=expected):
            SequenceDataModule(predict_path=str(path)).setup("predict")


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        ({"dataset": "text"}, "dataset"),
        ({"vocab_size": 2}, "vocab_size"),
        ({"dataset": "file", "vocab_size": 0}, "vocab_size"),
        ({"seq_len": 1}, "seq_len"),
        ({"dataset": "file", "seq_len": 0}, "seq_len"),
        ({"num_classes": 1}, "num_classes"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1.5}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction and --data.test_fraction"),
        ({"num_sequences": 0}, "num_sequences"),
        ({"num_sequences": 5}, "num_sequences"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(capsys, arguments, flag):
    """Each value out of range stops the command line with one line that starts with its --data flag: a value out
    of its type's bounds as it is parsed, one that does not go with the others as the data module is built."""
    flags = [text for name, value in arguments.items() for text in (f"--data.{name}", str(value))]
    assert re.match(rf"error: --data\.{flag}( must |: )", refused(flags, capsys))


@pytest.mark.parametrize(("val_fraction", "test_fraction"), [(0.1, 0.1), (0.45, 0.45), (0.3, 0.05), (0.01, 0.2)])
def test_the_number_of_sequences_named_is_enough(val_fraction, test_fraction):
    """The message's "N or more do" holds: every number of sequences from N on fills all three splits."""
    fractions = {"val_fraction": val_fraction, "test_fraction": test_fraction}
    with pytest.raises(ConfigError, match="or more do") as caught:
        SequenceDataModule(num_sequences=1, **fractions)
    enough = int(re.search(r"\((\d+) or more do\)", str(caught.value)).group(1))
    for num_sequences in range(enough, enough + 300):
        SequenceDataModule(num_sequences=num_sequences, **fractions)  # raises if a split would be empty
    dm = SequenceDataModule(num_sequences=enough, **fractions)
    dm.setup("fit")
    assert min(len(split) for split in dm.splits.values()) >= 1


def test_a_bad_size_on_the_command_line_is_one_line_naming_the_flag(in_tmp_path, synthetic_config):
    """`--data.num_sequences 0` ends in "error: --data.num_sequences ...", not a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        build(ProjectCLI, ["--config", synthetic_config, "--data.num_sequences", "0"])
    assert str(exit_info.value.code).startswith("error: --data.num_sequences must give at least one training")
