"""What the arguments of this project's classes accept: every numeric argument has its bounds in its type (which
the command line checks as it is parsed), and a value out of them, or against another argument, is one line naming
its flag."""

import inspect
import typing

import pytest
from conftest import refused

from {{ cookiecutter.project_slug }}.classifier import Classifier
{%- if cookiecutter.task == "image" %}
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule as Data
from {{ cookiecutter.project_slug }}.models.cnn import ReferenceCNN as Net
from {{ cookiecutter.project_slug }}.models.cnn import parameter_count
{%- else %}
from {{ cookiecutter.project_slug }}.data.sequences import SequenceDataModule as Data
from {{ cookiecutter.project_slug }}.models.attention import AttentionClassifier as Net
from {{ cookiecutter.project_slug }}.models.attention import parameter_count
{%- endif %}


@pytest.mark.parametrize("cls", [Net, Classifier, Data], ids=lambda cls: cls.__name__)
def test_every_numeric_argument_of_a_shipped_class_has_its_bounds_in_its_type(cls):
    """No constructor argument takes a plain int or float (alone, in a union or a tuple): each says what it accepts."""
    hints = typing.get_type_hints(cls.__init__)

    def plain(kind) -> bool:
        return kind in (int, float) or any(plain(inner) for inner in typing.get_args(kind))

    assert {name for name in inspect.signature(cls).parameters if plain(hints.get(name))} == set()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
{%- if cookiecutter.task == "image" %}
        (["--data.synthetic_size", str(10**12)], "the synthetic images would need about"),
        (["--data.synthetic_size", "-4"], "--data.synthetic_size must be"),
        (["--data.dataset", "imagenet"], "--data.dataset"),
        (["--model.lr", "0"], "--model.lr must be"),
        (["--model.lr", "inf"], "--model.lr"),
        (["--model.weight_decay", "-1"], "--model.weight_decay must be"),
{%- else %}
        (["--data.num_sequences", str(10**12)], "the synthetic sequences would need about"),
        (["--data.seq_len", str(10**9)], "the synthetic sequences would need about"),
        (["--data.vocab_size", "2"], "--data.vocab_size must be at least 3"),
        (["--data.seq_len", "1"], "--data.seq_len must be at least 2"),
        (["--data.num_classes", "1"], "--data.num_classes must be"),
        (["--data.batch_size", "0"], "--data.batch_size must be"),
        (["--data.batch_size", str(10**12)], "--data.batch_size must be"),
        (["--data.val_fraction", "0.6", "--data.test_fraction", "0.5"], "--data.val_fraction and --data.test_fraction"),
        (["--data.num_workers", str(10**6)], "--data.num_workers must be"),
        (["--data.seed", "-1"], "--data.seed must be"),
        (["--data.seed", str(2**40)], "--data.seed must be"),
        (["--model.lr", "0"], "--model.lr must be"),
        (["--model.weight_decay", "-1"], "--model.weight_decay must be"),
{%- endif %}
    ],
)
def test_data_and_classifier_arguments_out_of_range_are_one_line_naming_the_flag(
    synthetic_config, capsys, flags, named
):
    """A data or Classifier argument out of its range, or too large for memory, stops before anything is allocated."""
    message = refused(["--config", synthetic_config, "--accelerator", "cpu", *flags], capsys)
    assert message.startswith(f"error: {named}"), message


@pytest.mark.parametrize(
    "sizes",
{%- if cookiecutter.task == "image" %}
    [{"num_classes": 10, "image_size": 32}, {"num_classes": 3, "image_size": 67}],
{%- else %}
    [
        {"vocab_size": 16, "num_classes": 2, "max_len": 32, "d_model": 64, "num_layers": 2},
        {"vocab_size": 100, "num_classes": 7, "max_len": 10, "d_model": 48, "num_layers": 3},
    ],
{%- endif %}
)
def test_the_memory_estimate_counts_the_network_parameters(sizes):
    """The parameter count behind the memory check is the network's own (its bytes are 4 per parameter)."""
    assert parameter_count(**sizes) == sum(parameter.numel() for parameter in Net(**sizes).parameters())
