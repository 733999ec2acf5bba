"""What the arguments of this project's classes accept: every numeric argument has a row, and a value out of
range is one line naming its flag (the tables: ``ARGUMENTS`` of the Classifier and the data module, and
``NET_ARGUMENTS`` in cli.py for the network, which stays a plain nn.Module)."""

import inspect
import typing

import pytest
from conftest import refused

from {{ cookiecutter.project_slug }}.classifier import ARGUMENTS as CLASSIFIER_ARGUMENTS
from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.cli import NET_ARGUMENTS
{%- if cookiecutter.task == "image" %}
from {{ cookiecutter.project_slug }}.data.images import IMAGE_DATA_ARGUMENTS, ImageDataModule
from {{ cookiecutter.project_slug }}.models.cnn import ReferenceCNN as Net
from {{ cookiecutter.project_slug }}.models.cnn import parameter_count

CLASSES = [
    (Net, NET_ARGUMENTS),
    (Classifier, CLASSIFIER_ARGUMENTS),
    (ImageDataModule, IMAGE_DATA_ARGUMENTS),
]
{%- else %}
from {{ cookiecutter.project_slug }}.data.sequences import ARGUMENTS as DATA_ARGUMENTS
from {{ cookiecutter.project_slug }}.data.sequences import SequenceDataModule
from {{ cookiecutter.project_slug }}.models.attention import AttentionClassifier as Net
from {{ cookiecutter.project_slug }}.models.attention import parameter_count

CLASSES = [(Net, NET_ARGUMENTS), (Classifier, CLASSIFIER_ARGUMENTS), (SequenceDataModule, DATA_ARGUMENTS)]
{%- endif %}


@pytest.mark.parametrize(("cls", "arguments"), CLASSES, ids=lambda value: getattr(value, "__name__", ""))
def test_every_numeric_argument_of_a_shipped_class_is_in_its_table(cls, arguments):
    """Each constructor argument that takes a number, a flag or a choice has an accepted range in its class's table."""
    hints = typing.get_type_hints(cls.__init__)
    numeric = set()
    for name in inspect.signature(cls).parameters:
        kinds = typing.get_args(hints.get(name)) or (hints.get(name),)
        if any(kind in (int, float, bool) or typing.get_origin(kind) in (typing.Literal, tuple) for kind in kinds):
            numeric.add(name)
    assert numeric - set(arguments.table) == set()


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
