"""This project's command line: which classes ``train.py`` builds, their defaults, and what flows from the data.

Everything else (the Trainer shortcuts, checked checkpoints, one-line errors, the simulated
GPU) is lightning_kit's ``KitCLI``, which ``ProjectCLI`` subclasses.
"""

from lightning_kit.arguments import Arguments, FitsInMemory, {% if cookiecutter.task == "sequence" %}Together, {% endif %}integer, number{% if cookiecutter.task == "image" %}, per_channel{% endif %}
from lightning_kit.cli import KitCLI
from lightning_kit.cli import main as run_cli

from .classifier import LOSS_ON_PROGRESS_BAR_EVERY, Classifier
{%- if cookiecutter.task == "image" %}
from .data.images import ImageDataModule
from .models.cnn import ReferenceCNN, parameter_count

# What the network's arguments accept: it is a plain nn.Module, so its checks live here, where they enter.
NET_ARGUMENTS = Arguments(
    "--model.net.init_args.",
    {
        "num_classes": integer(2),
        "image_size": integer(8),
        "mean": per_channel(number(0, 1)),
        "std": per_channel(number(0, 1, low_open=True)),
    },
    rules=[FitsInMemory(("num_classes", "image_size"), lambda *sizes: 4 * parameter_count(*sizes), "the network")],
)
{%- else %}
from .data.sequences import SequenceDataModule
from .models.attention import AttentionClassifier, parameter_count

# What the network's arguments accept: it is a plain nn.Module, so its checks live here, where they enter.
NET_ARGUMENTS = Arguments(
    "--model.net.init_args.",
    {
        "vocab_size": integer(1),
        "num_classes": integer(2),
        "max_len": integer(1),
        "d_model": integer(1),
        "num_heads": integer(1),
        "num_layers": integer(1),
        "dropout": number(0, 1, high_open=True),
    },
    rules=[
        Together(
            ("num_heads", "d_model"),
            lambda heads, width: width % heads == 0,
            lambda heads, width: f"<num_heads> must divide <d_model> {width}",
            shown=("num_heads",),
        ),
        FitsInMemory(
            ("vocab_size", "num_classes", "max_len", "d_model", "num_layers"),
            lambda *sizes: 4 * parameter_count(*sizes),
            "the network",
        ),
    ],
)
{%- endif %}


class ProjectCLI(KitCLI):
    """``train.py``: the Classifier around {% if cookiecutter.task == "image" %}the reference CNN, on ImageDataModule{% else %}the attention classifier, on SequenceDataModule{% endif %} unless told otherwise."""

    model_class = Classifier
{%- if cookiecutter.task == "image" %}
    default_classes = {"model.net": ReferenceCNN, "data": ImageDataModule}
{%- else %}
    default_classes = {"model.net": AttentionClassifier, "data": SequenceDataModule}
{%- endif %}
    # What the network and the Classifier take from the data: argument -> the data module's attribute.
    # Each link applies when the data module has the attribute and the network takes the argument:
    # a network without one is left as is.
    data_links = {
        "model.num_classes": "num_classes",
        "model.class_names": "class_names",
        "model.net.init_args.num_classes": "num_classes",
{%- if cookiecutter.task == "image" %}
        "model.net.init_args.image_size": "image_size",
{%- else %}
        "model.net.init_args.vocab_size": "vocab_size",
        "model.net.init_args.max_len": "seq_len",
{%- endif %}
    }
{%- if cookiecutter.task == "image" %}
    argument_tables = {ReferenceCNN: NET_ARGUMENTS}
{%- else %}
    argument_tables = {AttentionClassifier: NET_ARGUMENTS}
{%- endif %}
    # Modules whose classes a run's config.yaml or a checkpoint may name besides this package and the
    # libraries it is built on, e.g. ("our_team.datasets",). For one command, naming the class is enough.
    trusted_modules = ()
    monitor = ("val/acc", "max")
    refresh_every = LOSS_ON_PROGRESS_BAR_EVERY


def main(args: list[str] | None = None) -> None:
    """``train.py``: run the command line on ``args`` (default: ``sys.argv[1:]``); without a subcommand, ``fit``."""
    run_cli(ProjectCLI, args)
